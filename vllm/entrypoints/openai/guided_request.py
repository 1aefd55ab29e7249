"""A request's structured-output fields -> GuidedDecodingParams (or a 400).

Accepted, as upstream vLLM: ``structured_outputs`` (upstream's current field: one of
``json``, ``regex``, ``choice``, ``grammar``, ``json_object``; ``structural_tag`` is a
400 here, and so is combining it with any field below), OpenAI's ``response_format``
({"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}};
"text" means no constraint) and
vLLM's ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``, with
``guided_decoding_backend`` ("xgrammar", or "xgrammar:disable-any-whitespace"). At most
one constraint per request. A chat request's older top-level ``structural_tag`` is a 400
too (not ignored). Whether the schema, regex or grammar itself is valid is
checked by the engine (the handler awaits that before streaming, so it is a 400 too).
"""

from __future__ import annotations

from vllm.entrypoints.openai.api_errors import APIError
from vllm.entrypoints.openai.protocol import SamplingFields
from vllm.sampling_params import GuidedDecodingParams, StructuredOutputsParams


def guided_field(req: SamplingFields) -> str | None:
    """The request field the constraint came from, for an error's ``param``:
    "response_format" (a type other than "text"), else the first guided_* field set
    (guided_json, guided_regex, guided_choice, guided_grammar), or "structured_outputs";
    None without one."""
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        return "response_format"
    for name in ("json", "regex", "choice", "grammar"):
        if getattr(req, f"guided_{name}") is not None:
            return f"guided_{name}"
    if req.structured_outputs is not None:
        return "structured_outputs"
    return None


def guided_params(req: SamplingFields) -> GuidedDecodingParams | None:
    """The request's constraint, None when it has none.

    Raises:
        APIError 400: more than one constraint, a json_schema format without a schema,
            a chat request's top-level ``structural_tag``, or a malformed field (the
            message names it).
    """
    if getattr(req, "structural_tag", None) is not None:
        raise APIError(
            "structural_tag is not supported by this build's structured outputs (use "
            "response_format, structured_outputs or guided_json / guided_regex / "
            "guided_choice / guided_grammar).",
            400,
            "structural_tag",
        )
    if req.structured_outputs is not None:
        return _structured_outputs(req)
    given: dict = {}
    param = guided_field(req)
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            given["json_object"] = True
        else:
            schema = fmt.json_schema.json_schema if fmt.json_schema is not None else None
            if schema is None:
                raise APIError(
                    'response_format of type "json_schema" needs json_schema.schema '
                    "(the JSON schema), got none.",
                    400,
                    "response_format",
                )
            given["json"] = schema
    for name in ("json", "regex", "choice", "grammar"):
        value = getattr(req, f"guided_{name}")
        if value is not None:
            given[name] = value
    if not given:
        return None
    if len(given) > 1:
        raise APIError(
            "at most one structured-output constraint per request (response_format, "
            f"guided_json, guided_regex, guided_choice, guided_grammar); got {sorted(given)}.",
            400,
            param,
        )
    try:
        return GuidedDecodingParams(**given, backend=req.guided_decoding_backend)
    except ValueError as e:
        raise APIError(str(e), 400, param) from None


def _structured_outputs(req: SamplingFields) -> StructuredOutputsParams:
    """``structured_outputs`` -> its constraint.

    Raises:
        APIError 400: another structured-output field set too (naming both),
            ``structural_tag``, no constraint or more than one.
    """
    other = guided_field(req)
    if other != "structured_outputs":
        raise APIError(
            f"structured_outputs cannot be combined with {other}: give one constraint, "
            "in structured_outputs.",
            400,
            "structured_outputs",
        )
    so = req.structured_outputs
    try:
        return StructuredOutputsParams(
            json=so.json_schema,
            regex=so.regex,
            choice=so.choice,
            grammar=so.grammar,
            json_object=so.json_object,
            structural_tag=so.structural_tag,
            backend=req.guided_decoding_backend,
            disable_any_whitespace=so.disable_any_whitespace,
            disable_additional_properties=so.disable_additional_properties,
            whitespace_pattern=so.whitespace_pattern,
        )
    except ValueError as e:
        raise APIError(f"structured_outputs: {e}", 400, "structured_outputs") from None

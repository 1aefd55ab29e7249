"""Constraints shared by the structured-output tests: bounded, so that even a random tiny
model completes them well within the token budgets used (strings have maxLength, arrays
maxItems, integers a range, and no free whitespace is allowed).

Strings are bounded by a pattern rather than maxLength: xgrammar's maxLength rule admits raw
control characters (a tab, say), which strict JSON parsers refuse."""

# A nested object, an enum, an array with min/max items, required fields.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9 ]{1,8}$"},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "tags": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 99},
            "minItems": 1,
            "maxItems": 3,
        },
        "home": {
            "type": "object",
            "properties": {"indoor": {"type": "boolean"}, "floor": {"enum": [1, 2, 3]}},
            "required": ["indoor", "floor"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "kind", "tags", "home"],
    "additionalProperties": False,
}

WEATHER_ARGS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Za-z ]{1,10}$"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}

REGEX = r"[a-z]{3}-[0-9]{2,4}"
CHOICES = ["yes", "no", "maybe so"]
# Enough for any output of the constraints above.
MAX_TOKENS = 120

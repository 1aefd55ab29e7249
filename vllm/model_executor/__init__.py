"""Model side of the engine: layers, model definitions and weight loaders."""

"""YAML -> a typed `Experiment`: the schema, strict YAML, the directive filter, the program spec, hyperparameter tables, JSON Schema."""

"""YAML -> a typed `Experiment`: the schema, strict YAML, the directive filter, a module per section (sweep, resources, container, distributed, program, hyperparameters), JSON Schema."""

"""Configuration: the schema, its four file formats, validation and the canonical hash."""

"""OpenAI wire types (pydantic v2) and the error envelope. No logic."""

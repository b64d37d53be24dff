"""Serving: OpenAI requests -> engine requests, engine outputs -> OpenAI responses/chunks."""

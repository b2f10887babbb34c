"""The OpenAI-compatible proxy: forward the chat completion, check the answer against its context."""

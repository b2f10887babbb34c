"""The NeMo app's embedding model: an OpenAI-compatible `/v1/embeddings` over httpx (NeMo's own OpenAI provider
needs the `openai` package, which NeMo's virtualenv does not have). Its URL and key come from the config's
`embeddings` model parameters: here, `morphguard serve`, which passes embeddings through to the provider."""

from __future__ import annotations

from typing import Any

import httpx
from nemoguardrails.embeddings.providers.base import EmbeddingModel


class HttpEmbeddings(EmbeddingModel):
    engine_name = "http_embeddings"

    def __init__(self, embedding_model: str, base_url: str = "", api_key: str = "", **_: Any) -> None:
        self.model, self.url, self.key = embedding_model, f"{base_url.rstrip('/')}/embeddings", api_key

    def encode(self, documents: list[str]) -> list[list[float]]:
        reply = httpx.post(self.url, json={"model": self.model, "input": documents}, timeout=30,
                           headers={"Authorization": f"Bearer {self.key}"})
        reply.raise_for_status()
        return [item["embedding"] for item in reply.json()["data"]]

    async def encode_async(self, documents: list[str]) -> list[list[float]]:
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(self.url, json={"model": self.model, "input": documents},
                                      headers={"Authorization": f"Bearer {self.key}"})
        reply.raise_for_status()
        return [item["embedding"] for item in reply.json()["data"]]


def init(app: Any) -> None:
    app.register_embedding_provider(HttpEmbeddings, HttpEmbeddings.engine_name)

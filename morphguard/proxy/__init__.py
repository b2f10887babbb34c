"""The OpenAI-compatible proxy: the HTTP edge that forwards a request and has its answer settled
(`morphguard.settle`)."""

import asyncio, sys, time, httpx
BODY = {"model": "bench", "messages": [{"role": "user", "content": "<context>The Eiffel Tower is in Paris, France.</context>\nWhere is the Eiffel Tower?"}]}
async def main(url, conc, n):
    async with httpx.AsyncClient(base_url=url, timeout=60, headers={"Authorization": "Bearer sk-bench"}) as c:
        it = iter(range(n))
        async def w():
            for _ in it:
                r = await c.post("/v1/chat/completions", json=BODY); assert r.status_code == 200, r.text
        t = time.perf_counter(); await asyncio.gather(*(w() for _ in range(conc))); print(n / (time.perf_counter() - t), "req/s")
asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))

"""What the fork server of tests/forked.py imports and computes once, so that no forked command pays it again:
morphguard's commands, litellm, the modules the openai client imports on its first call, and the text-folding
tables every proxy builds at start-up."""

from importlib import import_module

from morphguard import folding

for name in ("morphguard.cli", "morphguard.server", "morphguard.proxy.app", "morphguard.worker",
             "morphguard.detectors.registry",
             "morphguard.llm.client",  # before litellm: it sets how litellm loads its model table
             "litellm",  # imported by the judge client as it is built
             "openai.resources"):  # imported by the openai client on its first call
    import_module(name)
folding.warm()

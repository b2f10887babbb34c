"""Every span, event, attribute and metric name morphguard emits, in one place.

GenAI names follow the OpenTelemetry semantic conventions for generative AI; OpenInference names are
what Arize Phoenix reads; everything of our own is under `morphguard.*`.
"""

# Spans
SPAN_CHAT = "{operation} {model}"  # a GenAI client call (upstream or judge; "chat", or a verifier's endpoint)
SPAN_GUARDRAIL = "apply_guardrail morphguard"
SPAN_SERVER = "{method} {route}"
SPAN_REMOTE_CHECK = "morphguard.remote_check"  # a worker's half of an inline check handed to the pool

# GenAI semantic conventions
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOKEN_TYPE = "gen_ai.token.type"
INPUT_MESSAGES = "gen_ai.input.messages"  # content capture only
OUTPUT_MESSAGES = "gen_ai.output.messages"  # content capture only
OP_CHAT = "chat"
OP_GUARDRAIL = "apply_guardrail"

GUARDRAIL_NAME = "gen_ai.guardrail.name"
GUARDRAIL_TARGET = "gen_ai.guardrail.target.type"
GUARDRAIL_DECISION = "gen_ai.guardrail.decision.type"  # allow | warn | modify | deny
GUARDRAIL_REASON = "gen_ai.guardrail.decision.reason"

EVENT_EVALUATION = "gen_ai.evaluation.result"
EVALUATION_NAME = "gen_ai.evaluation.name"
EVALUATION_SCORE = "gen_ai.evaluation.score.value"
EVALUATION_LABEL = "gen_ai.evaluation.score.label"
EVALUATION_EXPLANATION = "gen_ai.evaluation.explanation"
EVALUATION_HALLUCINATION = "hallucination"

# HTTP server span
HTTP_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_STATUS = "http.response.status_code"
URL_PATH = "url.path"
URL_SCHEME = "url.scheme"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"  # a failed call: the HTTP status, or the exception's class

# Ours
DETECTOR = "morphguard.detector"
SCORE = "morphguard.score"
THRESHOLD = "morphguard.threshold"
FLAGGED = "morphguard.flagged"
ACTION = "morphguard.action"
TOPIC = "morphguard.topic"
PROFILE = "morphguard.profile"
REQUEST_ID = "morphguard.request_id"
CANDIDATE = "morphguard.shadow.candidate"  # a shadow candidate's configured name
SHADOW_OUTCOME = "morphguard.shadow.outcome"  # agree | disagree | failed
WOULD_FLAG = "morphguard.shadow.would_flag"
WOULD_BLOCK = "morphguard.shadow.would_block"
CHECK_MODE = "morphguard.check.mode"  # inline | async
REASON = "morphguard.reason"
CHECKED = "morphguard.checked"  # whether a check ran (a decision taken on no check is not a pass)
ROLE = "morphguard.llm.role"  # upstream | judge
STAGE = "morphguard.stage"
STAGE_CALLS = "morphguard.stage.llm_calls"
CACHED_INPUT_TOKENS = "morphguard.stage.cached_input_tokens"  # of gen_ai.usage.input_tokens, the provider cache's
FACTOIDS = "morphguard.factoids"
QUESTION = "morphguard.question"  # content capture only
CONTEXT = "morphguard.context"  # content capture only
ANSWER = "morphguard.answer"  # content capture only

EVENT_FACTOID = "morphguard.factoid"
FACTOID_TEXT = "morphguard.factoid.text"  # content capture only
FACTOID_SCORE = "morphguard.factoid.score"
FACTOID_START = "morphguard.factoid.start"
FACTOID_END = "morphguard.factoid.end"
FACTOID_FLAGGED = "morphguard.factoid.flagged"

# OpenInference (Arize Phoenix), optional
OI_PROJECT = "openinference.project.name"  # resource attribute: the Arize Phoenix project
OI_SPAN_KIND = "openinference.span.kind"  # LLM | GUARDRAIL | EVALUATOR | CHAIN
OI_INPUT = "input.value"
OI_OUTPUT = "output.value"
OI_MODEL = "llm.model_name"
OI_PROMPT_TOKENS = "llm.token_count.prompt"
OI_COMPLETION_TOKENS = "llm.token_count.completion"
OI_EVAL_NAME = "evaluation.name"
OI_EVAL_SCORE = "evaluation.score"
OI_EVAL_LABEL = "evaluation.label"
OI_EVAL_EXPLANATION = "evaluation.explanation"

# Metrics
METRIC_HTTP_DURATION = "http.server.request.duration"
METRIC_HTTP_ACTIVE = "http.server.active_requests"
METRIC_TOKENS = "gen_ai.client.token.usage"
METRIC_DURATION = "gen_ai.client.operation.duration"
METRIC_SCORE = "morphguard.score"
METRIC_CHECK_DURATION = "morphguard.check.duration"
METRIC_DECISIONS = "morphguard.decisions"
METRIC_QUEUE_DEPTH = "morphguard.queue.depth"  # checks waiting or being checked
METRIC_QUEUE_CLAIMED = "morphguard.queue.claimed"  # read by a worker, not yet done (Redis)
METRIC_QUEUE_LAG = "morphguard.queue.lag"  # not yet read by any worker (Redis)
METRIC_QUEUE_DEAD = "morphguard.queue.dead_letters"  # poison checks set aside (Redis)
METRIC_QUEUE_REDELIVERIES = "morphguard.queue.redeliveries"  # checks taken over from a dead worker
METRIC_QUEUE_REFUSED = "morphguard.queue.refused"  # entries and replies without the fleet key's seal
METRIC_ESCALATION_BACKLOG = "morphguard.escalations.backlog"  # pending, or undelivered with a retry ahead
METRIC_FAIL_OPEN = "morphguard.fail_open"
METRIC_ERRORS = "morphguard.errors"  # by REASON: upstream_timeout, audit_failed, judge_error, judge_timeout, ...
METRIC_JUDGE_RESTARTS = "morphguard.judge.restarts"
METRIC_SHADOW_CHECKS = "morphguard.shadow.checks"  # by CANDIDATE, SHADOW_OUTCOME, WOULD_FLAG, WOULD_BLOCK
METRIC_SHADOW_DURATION = "morphguard.shadow.duration"
METRIC_SHADOW_TOKENS = "morphguard.shadow.tokens"  # the candidate judge's, by CANDIDATE and TOKEN_TYPE

# Services
SERVICE_NAME = "service.name"
SERVICE_INSTANCE = "service.instance.id"
TRACER_NAME = "morphguard"

"""The attribute, span and metric names the telemetry ring emits, in one place.

GenAI names follow the OpenTelemetry semantic conventions 1.44.0 (`SEMCONV_SCHEMA_URL`): the
latest experimental GenAI conventions, which instrumentations that emitted older versions
gate behind ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``. agent_flow never
emitted an older version, so it emits these by default and only these. agent_flow's own
attributes live under ``agent_flow.*``. The names are spelled here rather than imported from
``opentelemetry-semantic-conventions``, which the API alone does not install.
"""

from __future__ import annotations

from typing import Final

SEMCONV_VERSION: Final = "1.44.0"
SEMCONV_SCHEMA_URL: Final = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

# -- GenAI (semantic conventions) ------------------------------------------------------------
OPERATION_NAME: Final = "gen_ai.operation.name"
PROVIDER_NAME: Final = "gen_ai.provider.name"
AGENT_NAME: Final = "gen_ai.agent.name"
AGENT_ID: Final = "gen_ai.agent.id"
CONVERSATION_ID: Final = "gen_ai.conversation.id"
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
REQUEST_TOP_P: Final = "gen_ai.request.top_p"
REQUEST_SEED: Final = "gen_ai.request.seed"
REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
RESPONSE_ID: Final = "gen_ai.response.id"
RESPONSE_MODEL: Final = "gen_ai.response.model"
RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
REASONING_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
INPUT_MESSAGES: Final = "gen_ai.input.messages"
OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
TOKEN_TYPE: Final = "gen_ai.token.type"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"
HTTP_STATUS_CODE: Final = "http.response.status_code"

INVOKE_AGENT: Final = "invoke_agent"
CHAT: Final = "chat"
EXECUTE_TOOL: Final = "execute_tool"

TOKEN_USAGE_METRIC: Final = "gen_ai.client.token.usage"
DURATION_METRIC: Final = "gen_ai.client.operation.duration"
TIME_TO_FIRST_CHUNK_METRIC: Final = "gen_ai.client.operation.time_to_first_chunk"
# The conventions' advised bucket boundaries: token counts, and seconds (both time metrics).
TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip

# -- agent_flow's own ------------------------------------------------------------------------
RUN_ID: Final = "agent_flow.run.id"
ITERATION: Final = "agent_flow.iteration"
STOP_REASON: Final = "agent_flow.stop_reason"
ITERATIONS: Final = "agent_flow.iterations"
COST_USD: Final = "agent_flow.cost_usd"
CALL_SOURCE: Final = "agent_flow.model_call.source"
TOOL_CALLS: Final = "agent_flow.model_call.tool_calls"
ATTEMPTS: Final = "agent_flow.model_call.attempts"
RETRY: Final = "agent_flow.model_call.retry"
RETRY_ATTEMPT: Final = "agent_flow.retry.attempt"
RETRY_MAX_ATTEMPTS: Final = "agent_flow.retry.max_attempts"
RETRY_DELAY: Final = "agent_flow.retry.delay"
RETRY_REASON: Final = "agent_flow.retry.reason"
MCP_TOOL: Final = "agent_flow.tool.mcp"
MCP_SERVER: Final = "agent_flow.tool.mcp.server"
PROMPT_PREFIX: Final = "agent_flow.prompt."
PROMPT_BUILT: Final = "agent_flow.prompt.built"
HISTORY_PRUNED: Final = "agent_flow.history.pruned"
ENVIRONMENT_UPDATED: Final = "agent_flow.environment.updated"
PLAN_UPDATED: Final = "agent_flow.plan.updated"
WARNING: Final = "agent_flow.warning"
APPROVAL_REQUIRED: Final = "agent_flow.approval.required"
APPROVAL_RESOLVED: Final = "agent_flow.approval.resolved"

UTILIZATION_METRIC: Final = "agent_flow.context.utilization"
PRUNED_ENTRIES_METRIC: Final = "agent_flow.history.pruned_entries"
PRUNED_TOKENS_METRIC: Final = "agent_flow.history.pruned_tokens"
COST_METRIC: Final = "agent_flow.cost"
# An observable instrument with no points: collecting it records the queued ones.
FLUSH_METRIC: Final = "agent_flow.telemetry.flush"
SECTION: Final = "agent_flow.prompt.section"
PRUNE_ACTION: Final = "agent_flow.history.prune_action"

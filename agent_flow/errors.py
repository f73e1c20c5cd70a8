"""Every exception agent_flow raises, in one tree.

```
AgentFlowError
├── UserError                   a usage mistake, raised early, before anything runs
│   ├── ConfigError             a configuration value or file is invalid
│   ├── ToolDefinitionError     a tool cannot be built from what was given
│   │   └── DuplicateToolError  two tools would share one name
│   └── PointerError            a JSON pointer is malformed or names nothing
├── EnvironmentValidationError  a write does not fit a typed section, a schema, or a model
├── TokenizerError              no usable tokenizer encoding is installed
├── ContextBudgetError          the fixed parts of a prompt alone exceed the budget
├── ModelError                  calling the model failed
│   ├── ModelHTTPError          the server answered with an HTTP error status
│   │   ├── ModelAuthenticationError   401 / 403: credentials are wrong
│   │   ├── ModelRateLimitError        429 after the SDK's retries
│   │   ├── ModelBadRequestError       400 / 404 / 422: the request was refused
│   │   └── ModelServerError           5xx after the SDK's retries
│   ├── ModelConnectionError    the server could not be reached, or dropped the connection
│   ├── ModelTimeoutError       the server did not answer in time
│   └── ModelResponseError      the answer could not be understood
│       ├── IncompleteStreamError   a stream ended without a finish reason
│       └── MalformedChunkError     a stream chunk was not valid JSON
├── ToolError                   a tool failed (turned into an error result for the model)
│   ├── ToolTimeoutError        a tool call ran past its timeout
│   └── MCPServerError          an MCP server could not be started or reached
│       └── MCPServerTimeoutError   it did not answer in time while starting
├── RunError                    an agent run ended abnormally
│   ├── OutputValidationError   the final answer never matched the output schema
│   └── CostLimitError          a model call was not made: it could pass max_cost_usd
└── StoreError                  the session store failed
    ├── SessionNotFoundError    no session has the given id
    ├── SessionExistsError      a session with the id asked for is already stored
    ├── ExportFormatError       a file to import or replay is no readable session export
    └── SessionConflictError    another writer owns or kept changing the session being saved
        ├── SessionBusyError    another run holds the session's lease (its id: `run_id`)
        └── LeaseLostError      a writer's lease (fencing number) is stale: it wrote nothing
```

`UserError` subclasses say what to change in the caller's code or config; the others are
failures of a run. Every message is one sentence naming the offending value.

Every error pickles with its message and attributes (runs cross process boundaries): the
default `BaseException.__reduce__` calls the class with the message alone, which fails for
the classes that take keyword-only attributes, so `AgentFlowError` rebuilds without calling
``__init__`` and restores the attributes from the instance's ``__dict__``.
"""

from __future__ import annotations

from typing import TypeVar

_E = TypeVar("_E", bound=BaseException)

__all__ = [
    "AgentFlowError",
    "ConfigError",
    "ContextBudgetError",
    "CostLimitError",
    "DuplicateToolError",
    "EnvironmentValidationError",
    "ExportFormatError",
    "IncompleteStreamError",
    "LeaseLostError",
    "MCPServerError",
    "MCPServerTimeoutError",
    "MalformedChunkError",
    "ModelAuthenticationError",
    "ModelBadRequestError",
    "ModelConnectionError",
    "ModelError",
    "ModelHTTPError",
    "ModelRateLimitError",
    "ModelResponseError",
    "ModelServerError",
    "ModelTimeoutError",
    "OutputValidationError",
    "PointerError",
    "RunError",
    "SessionBusyError",
    "SessionConflictError",
    "SessionExistsError",
    "SessionNotFoundError",
    "StoreError",
    "TokenizerError",
    "ToolDefinitionError",
    "ToolError",
    "ToolTimeoutError",
    "UserError",
]


class AgentFlowError(Exception):
    """Base class of every error agent_flow raises."""

    def __reduce__(self) -> tuple[object, ...]:
        # (rebuild, its arguments, the state pickle restores with __setstate__)
        return (_rebuild, (type(self), self.args), self.__dict__ or None)


def _rebuild(cls: type[_E], args: tuple[object, ...]) -> _E:
    """Recreate an exception from its args without calling ``__init__`` (see `__reduce__`)."""
    return cls.__new__(cls, *args)


class UserError(AgentFlowError):
    """The library was used wrongly; raised early, before any work is done."""


class ConfigError(UserError):
    """A configuration value or file is invalid; the message names the key and its location."""


class ToolDefinitionError(UserError):
    """A tool cannot be built from the function, class or schema it was given."""


class DuplicateToolError(ToolDefinitionError):
    """Registering a tool would give two tools the same name."""


class PointerError(UserError, LookupError):
    """A JSON pointer is malformed, or names a location that does not exist."""


class EnvironmentValidationError(AgentFlowError):
    """A value does not fit where it goes; for writes, nothing changed.

    Raised when a write would break a typed section (``/task/status = "bogus"``) or a JSON
    schema of the environment or an extension, and when `Environment.get_extension` finds
    data that does not fit the requested model.
    """


class TokenizerError(AgentFlowError):
    """No installed tokenizer encoding can be loaded (agent_flow never downloads one)."""


class ContextBudgetError(AgentFlowError):
    """The fixed parts of a prompt (system template, tools, pinned entries) exceed the budget.

    Attributes:
        part: The part that is too large (``"system_prompt"``, ``"tools"``, ``"pinned_history"``
            or ``"fixed_costs"``).
        needed: Tokens the fixed parts need.
        available: Tokens the budget leaves for them.
    """

    def __init__(self, message: str, *, part: str, needed: int, available: int) -> None:
        super().__init__(message)
        self.part = part
        self.needed = needed
        self.available = available


class ModelError(AgentFlowError):
    """Calling the model failed.

    Attributes:
        retryable: Whether trying again later may succeed (rate limits, server errors,
            dropped connections) as opposed to errors that will repeat (bad credentials).
        attempts: How many attempts the client made before raising, when the client has
            its own retry layer (`OpenAIClient` does); ``None``: it tried once and left
            retrying to its caller.
        retry_after: Seconds the server asked to wait before trying again (``Retry-After``).
    """

    retryable: bool = False
    attempts: int | None = None
    retry_after: float | None = None


class ModelHTTPError(ModelError):
    """The server answered with an HTTP error status.

    Attributes:
        status_code: The HTTP status.
        code: The provider's error code, when the body carried one.
        body: The response body (parsed JSON when possible).
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        code: str | None = None,
        body: object = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.body = body


class ModelAuthenticationError(ModelHTTPError):
    """The server refused the credentials (401 or 403); check the API key and its variable."""


class ModelRateLimitError(ModelHTTPError):
    """The server kept answering 429 after the SDK's retries."""

    retryable = True


class ModelBadRequestError(ModelHTTPError):
    """The server refused the request itself (400, 404, 422): model name, options or messages."""


class ModelServerError(ModelHTTPError):
    """The server kept failing (5xx) after the SDK's retries."""

    retryable = True


class ModelConnectionError(ModelError):
    """The server could not be reached, or dropped the connection mid-answer."""

    retryable = True


class ModelTimeoutError(ModelError):
    """The server did not answer within the configured timeout."""

    retryable = True


class ModelResponseError(ModelError):
    """The server's answer could not be understood (empty, malformed, cut short)."""


class IncompleteStreamError(ModelResponseError):
    """A streamed answer ended without a finish reason: the answer is truncated."""

    retryable = True


class MalformedChunkError(ModelResponseError):
    """A chunk of a streamed answer was not valid JSON, or not a JSON object.

    Retryable, like a stream cut mid-answer (`OpenAIClient` tries again, except a second time
    for the same corruption at the same place).
    """

    retryable = True


class ToolError(AgentFlowError):
    """A tool failed; the executor turns it into an error result the model can read.

    Tools may raise it themselves to give the model a precise message.
    """


class ToolTimeoutError(ToolError):
    """A tool call ran past its timeout and was cancelled."""


class MCPServerError(ToolError):
    """An MCP server could not be started, reached, or kept alive."""


class MCPServerTimeoutError(MCPServerError):
    """An MCP server did not answer within its ``connect_timeout`` while starting."""


class RunError(AgentFlowError):
    """An agent run ended abnormally."""


class OutputValidationError(RunError):
    """The model's final answer never matched the output schema within the allowed retries.

    Attributes:
        last_answer: The last answer the model gave.
        problems: What was wrong with it.
    """

    def __init__(self, message: str, *, last_answer: str, problems: str) -> None:
        super().__init__(message)
        self.last_answer = last_answer
        self.problems = problems


class CostLimitError(RunError):
    """A model call was not made: its worst-case cost, with what the run spent, passes the limit.

    Raised before the call (by the agent's gate, `agent_flow.llm.metering.admit_model_call`)
    to a caller that calls a model on the agent's behalf, such as the summarizer while pruning;
    the agent ends the run with stop reason ``cost_limit`` and this message.

    Attributes:
        limit: The run's ``max_cost_usd``.
        spent: What the run's calls cost before this one, in US dollars.
        estimate: The call's worst case: its counted prompt and its whole output allowance.
    """

    def __init__(self, message: str, *, limit: float, spent: float, estimate: float) -> None:
        super().__init__(message)
        self.limit = limit
        self.spent = spent
        self.estimate = estimate


class StoreError(AgentFlowError):
    """The session store could not be read or written."""


class SessionNotFoundError(StoreError, LookupError):
    """No stored session has the given id."""


class SessionExistsError(StoreError):
    """A session was to be created (or imported) under an id that is already stored."""


class ExportFormatError(StoreError):
    """A file given as a session export cannot be read, or is not one.

    Raised by `SessionStore.import_` and `agent_flow.lab.load_export`: the file is at fault,
    not the store.
    """


class SessionConflictError(StoreError):
    """Another writer owns a session, or kept changing it while this store was saving a step."""


class SessionBusyError(SessionConflictError):
    """Another run holds the session's lease: raised by a claim, or by a write without a fence.

    Attributes:
        run_id: The run that holds the lease.
        holder: Who holds it (``pid@host:pidns`` for a `SessionRecorder`'s), when known.
        fence: The lease's fencing number, when known (0 otherwise).
    """

    def __init__(self, message: str, *, run_id: str, holder: str = "", fence: int = 0) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.holder = holder
        self.fence = fence


class LeaseLostError(SessionConflictError):
    """A writer's lease is stale: another claim took the session, or the lease was released.

    Raised by `SessionStore.renew` and by a write carrying that lease's fencing number; the
    write stored nothing.
    """

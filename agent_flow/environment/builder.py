"""`EnvironmentBuilder`: collects the parts of an `Environment`, then builds it in one go."""

from __future__ import annotations

from typing import Self, cast

from pydantic import BaseModel

from agent_flow._types import JsonObject, JsonValue
from agent_flow.environment.environment import DEFAULT_MAX_CHANGES, Environment
from agent_flow.environment.sections import KnowledgeBase, SystemState, TaskState, WorkspaceState

__all__ = ["EnvironmentBuilder"]


class EnvironmentBuilder:
    """Collects the parts of an `Environment`; every method returns the builder.

    ``Environment.builder().system(SystemState(...)).task(TaskState(...))
    .extension("dataset", Dataset(...)).extension_model("dataset", Dataset).build()``
    """

    def __init__(self) -> None:
        self._sections: dict[str, BaseModel | JsonObject] = {}
        self._extensions: dict[str, BaseModel | JsonValue] = {}
        self._schema: JsonObject | None = None
        self._extension_schemas: dict[str, JsonObject] = {}
        self._extension_models: dict[str, type[BaseModel]] = {}
        self._max_changes = DEFAULT_MAX_CHANGES

    def system(self, value: SystemState | JsonObject) -> Self:
        """Set the system section."""
        self._sections["system"] = value
        return self

    def task(self, value: TaskState | JsonObject) -> Self:
        """Set the task section."""
        self._sections["task"] = value
        return self

    def knowledge(self, value: KnowledgeBase | JsonObject) -> Self:
        """Set the knowledge section."""
        self._sections["knowledge"] = value
        return self

    def workspace(self, value: WorkspaceState | JsonObject) -> Self:
        """Set the workspace section."""
        self._sections["workspace"] = value
        return self

    def extension(self, name: str, value: BaseModel | JsonValue) -> Self:
        """Add extension `name` (a model is stored as its JSON)."""
        self._extensions[name] = value
        return self

    def schema(self, schema: JsonObject) -> Self:
        """Require the whole state to satisfy a JSON schema after every write."""
        self._schema = schema
        return self

    def extension_schema(self, name: str, schema: JsonObject) -> Self:
        """Require extension `name`, when present, to satisfy a JSON schema."""
        self._extension_schemas[name] = schema
        return self

    def extension_model(self, name: str, model: type[BaseModel]) -> Self:
        """Hold extension `name` to a pydantic model (see `Environment.register_extension`)."""
        self._extension_models[name] = model
        return self

    def max_changes(self, limit: int) -> Self:
        """Keep at most `limit` changes in the change log (default `DEFAULT_MAX_CHANGES`)."""
        self._max_changes = limit
        return self

    def build(self) -> Environment:
        """Return the Environment (validated against its models and schemas).

        Raises:
            UserError: A section does not fit its model, or a schema or model is invalid.
            EnvironmentValidationError: The state breaks a schema or an extension model.
        """
        sections = self._sections
        return Environment(
            system=cast("SystemState | JsonObject | None", sections.get("system")),
            task=cast("TaskState | JsonObject | None", sections.get("task")),
            knowledge=cast("KnowledgeBase | JsonObject | None", sections.get("knowledge")),
            workspace=cast("WorkspaceState | JsonObject | None", sections.get("workspace")),
            extensions=self._extensions,
            schema=self._schema,
            extension_schemas=self._extension_schemas,
            extension_models=self._extension_models,
            max_changes=self._max_changes,
        )

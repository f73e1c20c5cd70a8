"""Every exception class in agent_flow survives a pickle round trip (found automatically).

Exceptions cross process boundaries (multiprocessing, worker pools, durable runs), which
pickles them. The default `BaseException.__reduce__` rebuilds an exception by calling its class
with ``self.args`` only, which fails for every class whose constructor takes keyword-only or
extra arguments. The test discovers every exception class defined in any agent_flow module, so
a class added later is covered without touching this file.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

import agent_flow
import agent_flow.errors

# Sample values for constructor parameters, by their annotation (annotations are strings under
# ``from __future__ import annotations``). A class with a parameter of another type makes the
# test fail with a message saying to add a sample here.
_SAMPLES: dict[str, object] = {
    "str": "the offending value is 'x'; change it",
    "str | None": "provider_code",
    "int": 7,
    "int | None": 11,
    "float": 2.5,
    "object": {"error": {"message": "bad", "details": [1, 2]}},
    "bool": True,
}


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(agent_flow.__path__, prefix="agent_flow."):
        if info.name.endswith("__main__"):
            continue  # running it is the command itself
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.startswith("agent_flow")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


CLASSES = _exception_classes()


def _instance(cls: type[BaseException]) -> BaseException:
    signature = inspect.signature(cls.__init__)
    args: list[object] = []
    kwargs: dict[str, object] = {}
    for name, parameter in list(signature.parameters.items())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            if parameter.kind is parameter.VAR_POSITIONAL:
                args.append(_SAMPLES["str"])
            continue
        annotation = parameter.annotation
        key = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        if key not in _SAMPLES:
            pytest.fail(
                f"{cls.__qualname__}.__init__ has parameter {name!r} of type {key!r}; add a "
                "sample value for it to _SAMPLES"
            )
        if parameter.kind is parameter.KEYWORD_ONLY:
            kwargs[name] = _SAMPLES[key]
        else:
            args.append(_SAMPLES[key])
    return cls(*args, **kwargs)


def test_discovery_finds_the_whole_error_tree_and_the_private_exceptions() -> None:
    names = {cls.__qualname__ for cls in CLASSES}
    assert set(agent_flow.errors.__all__) <= names
    assert {"ScriptExhaustedError", "ToolArgumentsError", "UnsafePathError", "_Failure"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_every_exception_survives_a_pickle_round_trip(cls: type[BaseException]) -> None:
    error = _instance(cls)

    copy = pickle.loads(pickle.dumps(error))

    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)
    if isinstance(error, agent_flow.errors.ModelError):
        assert copy.retryable == error.retryable

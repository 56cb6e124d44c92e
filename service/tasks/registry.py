"""The served tasks: a manifest's `task` names its class here, and only here.

Adding a task is writing one module with a `Task` subclass and registering it: the REST route,
`/v1/models` and the Open Inference Protocol endpoints pick it up without changes.
"""

from __future__ import annotations

from service.tasks.base import Task
from service.tasks.classification import ClassificationTask
from service.tasks.text2text import Text2TextTask
from service.tasks.translation import TranslationTask

_TASKS: dict[str, type[Task]] = {}


def register(cls: type[Task]) -> type[Task]:
    if cls.name in _TASKS and _TASKS[cls.name] is not cls:
        raise ValueError(f"task {cls.name!r} is already registered")
    _TASKS[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    _TASKS.pop(name, None)


def get(name: str) -> type[Task] | None:
    return _TASKS.get(name)


def tasks() -> list[type[Task]]:
    return list(_TASKS.values())


register(ClassificationTask)
register(TranslationTask)
register(Text2TextTask)

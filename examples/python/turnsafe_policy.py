"""The turnsafe policy component, loaded with wasmtime-py's component API.

The component exports the interface ``turnsafe:policy/engine@0.4.0``; its
JSON entry points take and return strings, so this wrapper needs no
generated bindings. The instance is created once and reused; after a trap
it is discarded and a fresh one serves the next call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import wasmtime
import wasmtime.component as wc

INTERFACE = "turnsafe:policy/engine@0.4.0"
DEFAULT_COMPONENT = Path(__file__).resolve().parent / "build" / "turnsafe_policy.wasm"


class Policy:
    def __init__(self, component_path: str | os.PathLike | None = None) -> None:
        path = Path(component_path or os.environ.get("TURNSAFE_COMPONENT") or DEFAULT_COMPONENT)
        self._engine = wasmtime.Engine()
        self._component = wc.Component.from_file(self._engine, str(path))
        self._linker = wc.Linker(self._engine)
        self._live = None

    def _instance(self):
        if self._live is None:
            store = wasmtime.Store(self._engine)
            instance = self._linker.instantiate(store, self._component)
            iface = instance.get_export_index(store, INTERFACE)
            if iface is None:
                raise RuntimeError(f"the component does not export {INTERFACE}")
            funcs = {}
            for name in ("classify-json", "explain-json", "evaluate-json", "flush-step-json", "decide-lease-json",
                         "decide-scope-json", "version"):
                index = instance.get_export_index(store, name, iface)
                funcs[name] = instance.get_func(store, index)
            self._live = (store, funcs)
        return self._live

    def _call(self, name: str, *args):
        store, funcs = self._instance()
        func = funcs[name]
        try:
            out = func(store, *args)
            func.post_return(store)
            return out
        except wasmtime.Trap:
            self._live = None
            raise

    def classify_json(self, observation: str) -> str:
        return self._call("classify-json", observation)

    def explain_json(self, request: str) -> str:
        return self._call("explain-json", request)

    def evaluate_json(self, request: str) -> str:
        return self._call("evaluate-json", request)

    def flush_step_json(self, request: str) -> str:
        return self._call("flush-step-json", request)

    def decide_lease_json(self, request: str) -> str:
        """Whether a writer may take a turn lease another holder has."""
        return self._call("decide-lease-json", request)

    def decide_scope_json(self, request: str) -> str:
        """How far a failure inside a group's transaction reaches."""
        return self._call("decide-scope-json", request)

    def flush_step(self, request: dict) -> str:
        """One step of the flush machine; the answer's raw text."""
        return self.flush_step_json(json.dumps(request))

    def version(self) -> str:
        return self._call("version")

    def decide(self, observation: dict) -> dict:
        return json.loads(self.classify_json(json.dumps(observation)))

    def explain(self, cause: str, outcome: str, **context) -> dict:
        return json.loads(self.explain_json(json.dumps({"cause": cause, "outcome": outcome, **context})))

"""One Plan for every process of a ``jax.distributed`` job.

Process 0 searches; the others read its Plan from the job's key-value store. The search is
deterministic, so every process would reach the same Plan anyway; sharing it makes that a
guarantee (one search, one answer) even if hosts differ in speed or library versions.
"""

from __future__ import annotations

from collections.abc import Callable

from lagom_jax.plan.schema import Plan
from lagom_jax.program import jax_internals

_SHARE_TIMEOUT_MS = 10 * 60 * 1000


def one_plan_for_all_processes(key: str, search: Callable[[], Plan]) -> Plan:
    """``search()`` on process 0, its Plan read from the key-value store elsewhere.

    A failure on process 0 is published too, so nobody waits forever.
    """
    client, process_id, num_processes = jax_internals.distributed_state()
    if client is None or num_processes <= 1:
        return search()
    store_key = f"lagom_jax/plan/{key}"
    if process_id != 0:
        text = client.blocking_key_value_get(store_key, _SHARE_TIMEOUT_MS)
        if text.startswith("error:"):
            raise RuntimeError(f"process 0 could not tune this step: {text[6:]}")
        return Plan.from_json(text)
    try:
        plan = search()
    except Exception as err:
        _publish(client, store_key, f"error:{type(err).__name__}: {err}")
        raise
    _publish(client, store_key, plan.to_json())
    return plan


def one_value_for_all_processes(key: str, measure: Callable[[], float]) -> float:
    """``measure()`` on process 0, its value read from the key-value store elsewhere: the
    number every process bases a decision on (the decorator's re-tune), so all of them
    decide the same at the same step."""
    client, process_id, num_processes = jax_internals.distributed_state()
    if client is None or num_processes <= 1:
        return measure()
    store_key = f"lagom_jax/value/{key}"
    if process_id != 0:
        return float(client.blocking_key_value_get(store_key, _SHARE_TIMEOUT_MS))
    value = measure()
    _publish(client, store_key, repr(float(value)))
    return value


def _publish(client, key: str, value: str) -> None:
    try:
        client.key_value_set(key, value)
    except Exception as err:  # already published by an earlier tune of the same step
        if "ALREADY_EXISTS" not in str(err).upper().replace(" ", "_"):
            raise

"""The tests of Django's tests/tasks that do not apply to slotd's backend, each with its
reason (plugin.py skips them, and fails on a name Django's suite no longer has). Keyed
file::class::test. Everything else in Django's suite runs against slotd and passes."""

_CLASS = (
    "asserts the backend's class (DummyBackend / ImmediateBackend) and its empty options; "
    "the adaptation swaps the class"
)
_RESULTS_LIST = (
    "reads DummyBackend.results, the in-memory list of what was enqueued; slotd's results "
    "are rows (get_result reads them, and the other tests of enqueue check it)"
)
_RESULTS_LAST = (
    "every assertion on the READY result passes; the last one looks for it in "
    "DummyBackend.results, the in-memory list"
)
_REFUSES = (
    "checks that ImmediateBackend refuses it; slotd supports it (supports_get_result, "
    "supports_defer)"
)

INAPPLICABLE: dict[str, str] = {
    "test_dummy_backend.py::DummyBackendTestCase::test_using_correct_backend": _CLASS,
    "test_immediate_backend.py::ImmediateBackendTestCase::test_using_correct_backend": _CLASS,
    "test_tasks.py::TaskTestCase::test_using_correct_backend": _CLASS,
    "test_tasks.py::TaskTestCase::test_get_backend": _CLASS,
    "test_dummy_backend.py::DummyBackendTestCase::test_clear": (
        "DummyBackend.clear() empties its in-memory list; slotd has no such call (the "
        "harness empties slotd's tables before each test)"
    ),
    "test_dummy_backend.py::DummyBackendTestCase::test_refresh_result": (
        "sets the status on DummyBackend.results[0] in memory, then refreshes"
    ),
    "test_dummy_backend.py::DummyBackendTestCase::test_refresh_result_async": (
        "sets the status on DummyBackend.results[0] in memory, then refreshes"
    ),
    "test_dummy_backend.py::DummyBackendTransactionTestCase::"
    "test_doesnt_wait_until_transaction_commit_by_default": _RESULTS_LIST,
    "test_dummy_backend.py::DummyBackendTestCase::test_enqueue_task": _RESULTS_LAST,
    "test_dummy_backend.py::DummyBackendTestCase::test_enqueue_task_async": _RESULTS_LAST,
    "test_tasks.py::TaskTestCase::test_enqueue_task": _RESULTS_LIST,
    "test_tasks.py::TaskTestCase::test_enqueue_task_async": _RESULTS_LIST,
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_get_result": _REFUSES,
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_refresh_result": _REFUSES,
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_pass_run_after": _REFUSES,
    "test_tasks.py::TaskTestCase::test_refresh_result": (
        "an async test calling the sync result.refresh(): a database backend's refresh "
        "queries, which Django forbids inside an event loop (SynchronousOnlyOperation)"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_complex_return_value": (
        "a deliberate difference: a return value JSON cannot carry is FAILED with "
        "slotd.contrib.django.results.ReturnValueNotJSON (a TypeError subclass naming the "
        "value, since 0.1.0); the test asserts the exact class TypeError"
    ),
}

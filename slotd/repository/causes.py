"""The texts a dependant's cancel carries when a task it waits on ended without success
(format() texts whose %s is that task's id): written by every statement that ends a task
with dependants, whichever module runs it."""

PARENT_FAILED = "cancelled: task %s, which it waits on, failed"
PARENT_EXPIRED = "cancelled: task %s, which it waits on, expired"

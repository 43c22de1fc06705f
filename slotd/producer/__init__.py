"""The producer's API, run in the application's own process and transaction: enqueue, batches,
results, control (cancel, pause, resume) and the targets they write through."""

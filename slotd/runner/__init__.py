"""The runner: a slot's child process (own process group) that calls the handlers; it has no
queue connection, so it can never settle a task itself."""

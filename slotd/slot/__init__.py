"""A slot process: waits for a wake token, claims one task on its own connections, hands it to
its runner and watches the attempt (deadline, kill, cancel), then settles through lifecycle/."""

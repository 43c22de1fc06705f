"""The supervisor process: its one loop (signals, pipes, LISTEN, timers), the slots it keeps,
the chores and schedule threads, and what they hand back. Nothing here blocks the loop on the
database: statements run on the chores thread."""

"""Operations: the metrics, health checks and the minute history that operators read
(the dashboard lives in slotd/web/, the command line in slotd/commands/)."""

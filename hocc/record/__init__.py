"""hocc's flight recorder: every engine keeps its last calls as they ran
(recorder), writes them out on failure, SIGUSR1 or request (dump), and
`hocc trace DIR` merges every rank's dump into a report (report, plot)."""

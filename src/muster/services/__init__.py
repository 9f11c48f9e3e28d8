"""What the routes, the CLI's server side and the tests call: experiments, trials, jobs, logs,
metrics, search progress and the cluster. Services know nothing of HTTP (no FastAPI import);
their errors are `muster.errors` classes, which the server maps to status codes."""

"""Instance processes: the supervisor (start, watch, restart, stop), what it knows of each instance, and the zygote fork server instances start from."""

"""The service: the runtime in one process (deploy, submit, status), its status builders and the systemd integration."""

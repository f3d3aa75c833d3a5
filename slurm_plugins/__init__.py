"""What cluster admins install: SPANK plugin, prolog/epilog/health-check hooks (see ARCHITECTURE.md)."""

"""The container image: its definition rendered and checked, and the build command."""

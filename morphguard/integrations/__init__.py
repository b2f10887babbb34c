"""Plug-ins that run morphguard inside other gateways and frameworks."""

"""Fakes of the outside services the project talks to, served for real on loopback."""

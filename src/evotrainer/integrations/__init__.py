"""Bridges from other trainers into evotrainer's evidence (integrations/trl.py: a TRL callback)."""

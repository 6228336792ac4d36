"""Drafters propose token trees for the target to verify (see ``base.Drafter``)."""

"""Helpers shared by more than one test folder; a helper used by one folder lives beside its tests."""

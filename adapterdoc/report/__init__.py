"""Findings, reports and their renderers (text, json, junit, github)."""

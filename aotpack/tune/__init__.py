"""Stages 3-5: TopN candidates, their compilation and cache, PGO timing of the candidates."""

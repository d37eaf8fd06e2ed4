"""A module of the program's own (imported by ``leaves_finalizers.py``): what it holds is freed at the end."""
KEPT = None

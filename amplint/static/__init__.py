"""The static checker: libcst facts per file, one small query per rule."""

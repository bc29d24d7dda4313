"""Shared by tests/unit and tests/e2e. With no ``__init__.py`` here, pytest puts this directory on
``sys.path`` for this file, so test modules can ``import trainer_helpers`` as they import a
sibling (``stack``, ``shared_fixtures``)."""

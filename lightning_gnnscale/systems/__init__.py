"""The systems: one folder each (config, Strategy, DataModule, report callbacks).

``registry.SYSTEMS`` maps every strategy name to its classes; ``base`` holds what they share
and ``contract`` the typed objects their pieces exchange (docs/architecture.md).
"""

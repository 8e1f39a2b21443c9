"""Job configuration: parsing with positions, phase selection, validation."""

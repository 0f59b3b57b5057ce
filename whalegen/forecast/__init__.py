"""Feature building and XGBoost forecasters behind small typed functions. Pure: no Django."""

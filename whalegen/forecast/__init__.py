"""Feature building and XGBoost forecasters behind small typed functions. Pure: no Django.

`series` (pool series h ahead), `durations` (P50/P90 at submission), `memory` (GPU memory peak bound),
`arrivals` (expected arrivals per task shape), `profiles` (task profiles and right-sizing),
`interference` (co-location slowdown), `metrics`, and `store` (model envelopes, promotion rule).
See docs/forecasting.md.
"""

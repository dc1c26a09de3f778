"""pulse.localization"""

"""pulse.streams"""

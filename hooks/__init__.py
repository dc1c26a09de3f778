"""pulse.hooks"""

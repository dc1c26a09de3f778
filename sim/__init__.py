"""pulse.sim"""

"""pulse.producers"""

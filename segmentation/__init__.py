"""pulse.segmentation"""

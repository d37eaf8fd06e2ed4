"""convoy.launch"""

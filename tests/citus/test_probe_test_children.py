from tests.test_children import *  # noqa

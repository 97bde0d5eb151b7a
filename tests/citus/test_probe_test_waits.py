from tests.test_waits import *  # noqa

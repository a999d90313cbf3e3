# Runs rdma-core's pyverbs CM tests (tests/test_rdmacm.py of Debian's
# python3-pyverbs) on uroce: the same test methods and flows, with two
# changes to their harness (RDMACMBaseTest), because uroce is a device per
# process and not a kernel device:
# - the address comes from the environment (UROCE_PYVERBS_CM_ADDRS="PASSIVE
#   ACTIVE PARENT"), not from the netdev found under
#   /sys/class/infiniband/<dev>/device/net/ (uroce has no sysfs entry);
# - the passive and the active side run as two spawned processes, each
#   with its own device (UROCE_ADDR), and the active binds its own address
#   (rdma-core's harness forks both sides on one address, which needs one
#   device shared by two processes: a kernel device).
# Everything else (CMIDs, events, QPs, traffic, checks) is pyverbs' own,
# through the drop-in librdmacm.so.1 and libibverbs.so.1.
# Run from the tests folder, as run_tests.py: python3 pyverbs_cm.py -v
import multiprocessing as mp
import os
import sys
import unittest
from importlib.machinery import SourceFileLoader

from args_parser import parser

tests = SourceFileLoader('tests', os.path.join(os.path.dirname(os.path.abspath(__file__)), '__init__.py')).load_module()
import tests.base as base  # noqa: E402
import tests.base_rdmacm as base_rdmacm  # noqa: E402
from tests.test_rdmacm import CMTestCase  # noqa: E402

PASSIVE, ACTIVE, PARENT = os.environ.get('UROCE_PYVERBS_CM_ADDRS', '127.0.0.98 127.0.0.99 127.0.0.100').split()


def _bind_own_address(orig):
    """AddrInfo of the active side: source = this process's device."""

    def addrinfo(*args, **kwargs):
        if kwargs.get('dst') is not None:
            kwargs['src'] = os.environ['UROCE_ADDR']
        return orig(*args, **kwargs)

    return addrinfo


def _side(test_name, flow, resources, passive, syncer, notifier, kwargs):
    """One side of a test, in a spawned process with its own device."""
    if parser.get_config() is None:
        parser.parse_args()
    base_rdmacm.AddrInfo = _bind_own_address(base_rdmacm.AddrInfo)
    import tests.rdmacm_utils as utils

    utils.AddrInfo = _bind_own_address(utils.AddrInfo)
    case = UroceCMTestCase(test_name)
    case.ip_addr, case.syncer, case.notifier = PASSIVE, syncer, notifier
    getattr(case, flow)(connection_resources=getattr(utils, resources), passive=passive, **kwargs)


class UroceCMTestCase(CMTestCase):
    def setUp(self):
        unittest.TestCase.setUp(self)
        self.dev_name, self.ib_port, self.gid_index = 'uroce0', 1, 0
        self.ip_addr = PASSIVE
        self.pre_environment = {}

    def tearDown(self):
        unittest.TestCase.tearDown(self)

    def two_nodes_rdmacm_traffic(self, connection_resources, test_flow, bad_flow=False, **resource_kwargs):
        """RDMACMBaseTest's, with spawned sides on two addresses."""
        if resource_kwargs.get('port_space') == base.ce.RDMA_PS_UDP and self.is_eth_and_has_roce_hw_bug():
            raise unittest.SkipTest('Device {} doesn\'t support UDP with RoCEv2'.format(self.dev_name))
        ctx = mp.get_context('spawn')
        syncer = ctx.Barrier(base.NUM_OF_PROCESSES, timeout=15)
        notifier = ctx.Queue()
        # pyverbs' enums do not pickle across spawn: plain ints.
        kwargs = {k: int(v) if isinstance(v, int) else v for k, v in resource_kwargs.items()}
        procs = []
        for passive, addr in [(True, PASSIVE), (False, ACTIVE)]:
            os.environ['UROCE_ADDR'] = addr
            p = ctx.Process(
                target=_side,
                args=(self._testMethodName, test_flow.__name__, connection_resources.__name__, passive, syncer,
                      notifier, kwargs),
            )
            p.start()
            procs.append(p)
        os.environ['UROCE_ADDR'] = PARENT
        passive, active = procs
        repeat_times = 150 if not bad_flow else 3
        proc_res = {}
        for _ in range(repeat_times):
            for proc in [passive, active]:
                proc.join(0.1)
                if not proc.is_alive():
                    side = 'passive' if proc == passive else 'active'
                    proc_res.setdefault(side, proc.exitcode)
        proc_killed = False
        for proc in [passive, active]:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
                proc_killed = True
        for side in proc_res:
            if proc_res[side] == 5:
                raise unittest.SkipTest(f'SkipTest occurred on {side} side')
        if any(0 < proc_res[side] < 5 for side in proc_res):
            raise Exception('Exception in active/passive side occurred')
        if bad_flow and not proc_killed:
            raise Exception('Bad flow: traffic passed which is not expected')
        if not bad_flow and proc_killed:
            raise Exception('RDMA CM test procces is stuck, kill the test')


def load_tests(loader, standard_tests, pattern):
    return loader.loadTestsFromTestCase(UroceCMTestCase)


if __name__ == '__main__':
    os.environ['UROCE_ADDR'] = PARENT
    parser.parse_args()
    unittest.main(module=sys.modules[__name__])

"""scripts/ncu-stalls on the CPU, on a CSV shaped as `ncu --page source --print-source sass --csv`
writes it (a kernel line, then a header and a row a SASS instruction, numbers with thousands
separators): the instructions come out by stall samples, each with its share of all samples and
its top reasons; a CSV without the columns names itself rather than printing an empty table."""
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "ncu-stalls"


def run(path, *args, check=True):
    return subprocess.run([sys.executable, str(SCRIPT), str(path), *map(str, args)], capture_output=True, text=True,
                          check=check)


def test_instructions_by_stall_samples(tmp_path):
    csv = tmp_path / "source.csv"
    csv.write_text(
        '"Kernel Name","sm90_weight_grad_kernel"\n'
        '"# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
        '"stall_long_sb","stall_wait","stall_long_sb (Not Issued)"\n'
        '"0x20","LDG.E R2, [R4.64]","300","10","300","0","299"\n'
        '"0x10","SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4]","1,200","100","800","400","3"\n'
        '"0x30","IADD3 R1, R1, 0x1, RZ","0","0","0","0","0"\n')
    out = run(csv, 2).stdout.splitlines()
    assert out[0] == "3 instructions, 1500 stall samples; the 2 with the most:"
    assert "0x10" in out[1] and "80.0%" in out[1] and "TRYWAIT" in out[1] and "long_sb:800 wait:400" in out[1]
    assert "0x20" in out[2] and "20.0%" in out[2] and "long_sb:300" in out[2] and "wait" not in out[2]
    assert len(out) == 3


def test_other_columns_print_the_header(tmp_path):
    csv = tmp_path / "source.csv"
    csv.write_text('"# Address","Source","Instructions Executed"\n"0x10","NOP","5"\n')
    out = run(csv).stdout
    assert "columns not found" in out and "Instructions Executed" in out
    bad = tmp_path / "none.csv"
    bad.write_text("a,b\n1,2\n")
    r = run(bad, check=False)
    assert r.returncode != 0 and "no header row" in r.stderr

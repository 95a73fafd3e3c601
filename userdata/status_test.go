package userdata

import (
	"reflect"
	"testing"
)

func TestParseMarkers(t *testing.T) {
	log := []byte(`Cloud-init v. 22.4.2 running 'modules:final'
KLOUD-PROVISION step=download start
KLOUD-PROVISION step=download status=start detail="http://10.200.0.1:7000/dl/klient"
kloud-provision: download attempt 1 failed (curl exit code 7), retrying in 1s
KLOUD-PROVISION step=download status=ok detail="123 bytes"
[   12.3] KLOUD-PROVISION step=verify status=start
KLOUD-PROVISION step=verify status=failed detail="a \"quoted\" \\ thing"
KLOUD-PROVISION step=verify status=failed detail="unterminated
KLOUD-PROVISION step=done status=ok` + "\r\n")
	want := []Marker{
		{Step: StepDownload, Status: StatusStart, Detail: "http://10.200.0.1:7000/dl/klient"},
		{Step: StepDownload, Status: StatusOK, Detail: "123 bytes"},
		{Step: StepVerify, Status: StatusStart},
		{Step: StepVerify, Status: StatusFailed, Detail: `a "quoted" \ thing`},
		{Step: StepDone, Status: StatusOK},
	}
	if got := ParseMarkers(log); !reflect.DeepEqual(got, want) {
		t.Errorf("ParseMarkers =\n%#v\nwant\n%#v", got, want)
	}
}
